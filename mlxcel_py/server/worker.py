"""One MLX worker thread behind a queue; requests stream events back to the asyncio side.

All model work (warmup included) runs on this thread, one request at a time, so concurrent
clients are served in order without sharing caches. A client that disconnects sets its job's
cancel flag: a queued job is skipped, a running one stops at the next token and frees the worker.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from ..options import SamplingOptions
from ..text import TextStream


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingOptions
    stop: Sequence[str] = ()
    speculative: bool = True
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str
    stop_word: str | None
    stats: Any
    speculative: bool


class Worker:
    def __init__(self, engine: Any, tokenizer: Any, *, speculative_allowed: bool = True):
        self.engine = engine
        self.tokenizer = tokenizer
        self.speculative_allowed = speculative_allowed
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.active = 0
        self.served = 0
        self.ready = threading.Event()
        self.warmup_error: str | None = None
        self.thread = threading.Thread(target=self._loop, name="mlx-worker", daemon=True)

    def start(self, warmup: bool) -> None:
        self._warmup = warmup
        self.thread.start()
        self.ready.wait()

    @property
    def alive(self) -> bool:
        """Can take requests: the thread runs and warmup (if any) succeeded."""
        return self.thread.is_alive() and self.warmup_error is None

    @property
    def queue_depth(self) -> int:
        return self.jobs.qsize()

    def _emit(self, job: Job, kind: str, payload: Any) -> None:
        assert job.loop is not None and job.events is not None
        job.loop.call_soon_threadsafe(job.events.put_nowait, (kind, payload))

    def _loop(self) -> None:
        try:
            if self._warmup:
                self.engine.warmup()
        except Exception as exc:  # pragma: no cover - reported at startup
            self.warmup_error = str(exc)
        self.ready.set()
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            self.active = 1
            try:
                self._run(job)
            except Exception as exc:
                self._emit(job, "error", f"{type(exc).__name__}: {exc}")
            finally:
                self.active = 0
                self.served += 1

    def _run(self, job: Job) -> None:
        spec = job.speculative and self.speculative_allowed
        gen = self.engine.generate(job.prompt, max_tokens=job.max_tokens, sampling=job.sampling, speculative=spec)
        stream = TextStream(gen, self.tokenizer, job.stop)
        for piece in stream:
            if job.cancelled.is_set():
                break
            self._emit(job, "text", piece)
        stream.generation.close()
        finish = stream.finish_reason or ("cancelled" if job.cancelled.is_set() else "stop")
        self._emit(job, "done", Result(stream.text, list(gen.tokens), finish, stream.stop_word, gen.stats, spec))

    async def submit(self, job: Job) -> AsyncIterator[tuple[str, Any]]:
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        self.jobs.put(job)
        try:
            while True:
                kind, payload = await job.events.get()
                yield kind, payload
                if kind in ("done", "error"):
                    return
        finally:
            job.cancel()

    def stop(self) -> None:
        self.jobs.put(None)

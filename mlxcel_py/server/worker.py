"""One MLX worker thread behind a bounded queue; requests stream events back to the asyncio side.

All model work (warmup included) runs on this thread, one request at a time, so concurrent
clients are served in order without sharing caches. A client that disconnects (streaming or not)
sets its job's cancel flag: a queued job is skipped, a running one stops between prefill chunks or
at the next token and frees the worker. Beyond `max_queue` waiting jobs, `submit` refuses at once
(`Busy`, a 503 with Retry-After) instead of letting the queue grow without bound.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from .. import distributed
from ..options import SamplingOptions
from ..text import TextStream


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingOptions
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N per token ("logprobs" events before each text piece)
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
    logprobs: list = field(default_factory=list)  # engine.TokenLogprob per emitted token, when asked


class Busy(Exception):
    """The queue is full: the client should retry later."""


MAX_QUEUE = 64


class Worker:
    def __init__(self, engine: Any, tokenizer: Any, *, speculative_allowed: bool = True, max_queue: int = MAX_QUEUE):
        self.engine = engine
        self.tokenizer = tokenizer
        self.speculative_allowed = speculative_allowed
        self.max_queue = max_queue
        self.current: Job | None = None
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
            self.current = job
            try:
                self._run(job)
            except Exception as exc:
                self._emit(job, "error", f"{type(exc).__name__}: {exc}")
                if distributed.is_lost_contact(exc):  # the model is gone with that rank: stop serving
                    sys.stderr.write(f"error: {distributed.lost(exc, 0).message}\n")
                    os.kill(os.getpid(), signal.SIGTERM)
            finally:
                self.active = 0
                self.current = None
                self.served += 1

    def _run(self, job: Job) -> None:
        spec = self.speculative_allowed
        gen = self.engine.generate(job.prompt, max_tokens=job.max_tokens, sampling=job.sampling, speculative=spec,
                                   ignore_eos=job.ignore_eos, cancelled=job.cancelled.is_set, logprobs=job.logprobs)
        stream = TextStream(gen, self.tokenizer, job.stop)
        sent = 0
        for piece in stream:
            if job.cancelled.is_set():
                break
            if job.logprobs is not None:  # the logprobs of the tokens this piece completes
                self._emit(job, "logprobs", gen.logprobs_out[sent : piece.tokens])
                sent = piece.tokens
            self._emit(job, "text", piece)
        stream.generation.close()
        finish = stream.finish_reason or ("cancelled" if job.cancelled.is_set() else "stop")
        self._emit(job, "done", Result(stream.text, list(gen.tokens), finish, stream.stop_word, gen.stats, spec,
                                       list(gen.logprobs_out)))

    def admit(self, job: Job) -> None:
        """Queue a job, or refuse it at once when `max_queue` jobs already wait."""
        if self.jobs.qsize() >= self.max_queue:
            raise Busy(f"{self.jobs.qsize()} requests are waiting")
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        self.jobs.put(job)

    async def submit(self, job: Job) -> AsyncIterator[tuple[str, Any]]:
        if job.events is None:
            self.admit(job)
        try:
            while True:
                kind, payload = await job.events.get()
                yield kind, payload
                if kind in ("done", "error"):
                    return
        finally:
            job.cancel()

    def cancel_all(self) -> None:
        """Shutdown: every queued job is skipped and the running one stops at its next check."""
        if self.current is not None:
            self.current.cancel()
        for job in list(self.jobs.queue):
            if job is not None:
                job.cancel()

    def stop(self) -> None:
        self.cancel_all()
        self.jobs.put(None)

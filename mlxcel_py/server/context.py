"""What every route shares, kept on `app.state.ctx`: the loaded model's tokenizer and engine, the
worker, and the steps from a parsed request to a finished job.

Reading a request is `requests.RequestReader`'s (`ctx.requests`), shaping a response
`responses.ResponseShapes`' (`ctx.responses`); this module hands jobs to the worker: `collect`
and `stream` admit a job (a dead worker or a full queue answers 503 before any body), and a
client that leaves cancels it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from .. import __version__
from ..engine.text import TextPiece
from ..options import SamplingOptions
from .http import BODY_LIMIT, ApiError, error_body, log
from .requests import RequestReader
from .responses import ResponseShapes, sse
from .worker import Busy, Job, Result, ShuttingDown, Worker


@dataclass
class ServerContext:
    tokenizer: Any
    engine: Any
    worker: Worker
    defaults: SamplingOptions
    max_tokens: int  # the server's -n: -1 no cap
    model_id: str
    body_limit: int = BODY_LIMIT
    max_predict_ms: int = 0  # --max-predict-ms
    reasoning_format: str = "auto"  # --reasoning-format: a request's default
    verbose: bool = False  # -v: chat replies carry `__verbose`
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        # the embedding's rows: a config may declare more than the tokenizer has (padding), never fewer
        self.vocab = self.engine.vocab_size or len(self.tokenizer.get_vocab())
        self.requests = RequestReader(
            self.tokenizer,
            self.vocab,
            self.engine.context_length,
            self.defaults,
            self.max_tokens,
            self.body_limit,
            self.max_predict_ms,
        )
        self.responses = ResponseShapes(self.tokenizer)
        # llama-server's form, b<build>-<commit>: here the version and a hash of version and model
        digest = hashlib.sha256(f"mlxcel-py {__version__} {self.model_id}".encode()).hexdigest()[:8]
        self.fingerprint = f"b{__version__}-{digest}"
        from .metrics import Metrics

        self.metrics = Metrics(self.worker, self.engine)
        if self.worker is not None:
            self.worker.metrics = self.metrics

    # ---- running a job ---------------------------------------------------------------------
    def admit(self, job: Job) -> None:
        """Into the worker's queue now, so a dead worker or a full queue answers before any body."""
        if not self.worker.alive:
            raise ApiError("the model worker is not running; see the server log", status=503, type="unavailable_error")
        try:
            self.worker.admit(job)
        except Busy as exc:
            raise ApiError(
                f"the server is busy ({exc}); retry later",
                status=503,
                type="unavailable_error",
                headers={"Retry-After": "1"},
            ) from None

    @staticmethod
    def failed(payload: Any) -> str:
        rid = uuid.uuid4().hex[:12]
        log(f"mlxcel serve: request {rid}: generation failed: {payload}")
        return f"generation failed (request id {rid})"

    def admit_all(self, jobs: list[Job]) -> None:
        """Every job of one request into the queue, or none (a full queue cancels those already in)."""
        try:
            for job in jobs:
                self.admit(job)
        except ApiError:
            for job in jobs:
                job.cancel()
            raise

    async def collect_many(self, jobs: list[Job], request: Request) -> list[Result]:
        """Results of one request's jobs (`n` choices, a prompt batch), decoded side by side; one
        failing (or the client leaving) cancels the rest."""
        if len(jobs) == 1:
            return [await self.collect(jobs[0], request)]
        for job in jobs:
            job.pieces = False
        self.admit_all(jobs)
        tasks = [asyncio.create_task(self.collect(job, request, admitted=True)) for job in jobs]
        try:
            results = list(await asyncio.gather(*tasks))
        finally:
            for task, job in zip(tasks, jobs):
                task.cancel()
                job.cancel()
        request.state.tokens = sum(r.stats.generated_tokens for r in results)
        return results

    async def collect(self, job: Job, request: Request, *, admitted: bool = False) -> Result:
        """A non-streaming job's result; a client that hangs up cancels it (checked every 0.2 s)."""
        job.pieces = False  # text pieces would only be dropped here: the worker need not send them
        if not admitted:
            self.admit(job)

        async def watch() -> None:
            while not job.cancelled.is_set():
                if await request.is_disconnected():
                    job.cancel()
                    return
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch())
        result = None
        try:
            async for kind, payload in self.worker.submit(job):
                if kind == "error" and isinstance(payload, ShuttingDown):
                    raise ApiError(str(payload), status=503, type="unavailable_error")
                if kind == "error":
                    raise ApiError(self.failed(payload), status=500, type="server_error")
                if kind == "done":
                    result = payload
        finally:
            watcher.cancel()
        assert result is not None
        request.state.tokens = result.stats.generated_tokens  # for the access line
        return result

    def stream(
        self,
        job: Job,
        request: Request,
        on_text: Callable[[TextPiece, list], dict | list[dict]],
        on_done: Callable[[Result], dict | list[dict]],
        *,
        head: dict | list[dict] | None = None,
        done_sentinel: bool = True,
        frame: Callable[[dict], str] = sse,
        on_error: Callable[[str, str], dict] = error_body,
        on_progress: Callable[[dict], dict] | None = None,
    ) -> StreamingResponse:
        """SSE for one job: optional head frames, frames per text piece (and per prompt chunk
        with `on_progress`, for a job that asked for progress), the final frames. Each
        callback returns one frame or a list; `frame` spells a frame (OpenAI's bare `data:`
        lines by default, Anthropic's `event:` + `data:`), `on_error` an error frame."""
        self.admit(job)

        def frames(objs: dict | list[dict]) -> str:
            return "".join(frame(o) for o in (objs if isinstance(objs, list) else [objs]))

        async def events():
            if head is not None:
                yield frames(head)
            lps: list = []
            async for kind, payload in self.worker.submit(job):
                if kind == "logprobs":
                    lps = payload
                elif kind == "progress":
                    if on_progress is not None:
                        yield frames(on_progress(prompt_progress(payload)))
                elif kind == "text":
                    yield frames(on_text(payload, lps))
                    lps = []
                elif kind == "error" and isinstance(payload, ShuttingDown):
                    yield frames(on_error(str(payload), "unavailable_error"))
                elif kind == "error":
                    yield frames(on_error(self.failed(payload), "server_error"))
                else:
                    request.state.tokens = payload.stats.generated_tokens
                    yield frames(on_done(payload))
            if done_sentinel:
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def stream_many(
        self,
        jobs: list[Job],
        request: Request,
        on_text: Callable[[int, TextPiece, list], list[dict]],
        on_done: Callable[[int, Result], list[dict]],
        on_all: Callable[[list[Result]], list[dict]],
        *,
        head: list[dict] | None = None,
        done_sentinel: bool = True,
    ) -> StreamingResponse:
        """SSE for one request's several jobs (`n` choices, a prompt batch): their frames as each
        job's pieces arrive, tagged by the callbacks with the job's index; `on_all` once all are
        done. An error ends the whole stream with an error frame; leaving cancels every job."""
        self.admit_all(jobs)

        async def events():
            if head:
                yield "".join(sse(o) for o in head)
            queue: asyncio.Queue = asyncio.Queue()

            async def pump(i: int, job: Job) -> None:
                try:
                    async for kind, payload in self.worker.submit(job):
                        queue.put_nowait((i, kind, payload))
                finally:
                    queue.put_nowait((i, "end", None))

            tasks = [asyncio.create_task(pump(i, j)) for i, j in enumerate(jobs)]
            results: dict[int, Result] = {}
            lps: dict[int, list] = {}
            try:
                ended = 0
                while ended < len(jobs):
                    i, kind, payload = await queue.get()
                    if kind == "end":
                        ended += 1
                    elif kind == "progress":
                        continue  # several jobs' prompts: no progress frames
                    elif kind == "logprobs":
                        lps[i] = payload
                    elif kind == "text":
                        yield "".join(sse(o) for o in on_text(i, payload, lps.pop(i, [])))
                    elif kind == "error":
                        why = str(payload) if isinstance(payload, ShuttingDown) else self.failed(payload)
                        kind = "unavailable_error" if isinstance(payload, ShuttingDown) else "server_error"
                        yield sse(error_body(why, kind))
                        break
                    else:
                        results[i] = payload
                        yield "".join(sse(o) for o in on_done(i, payload))
                if len(results) == len(jobs):
                    ordered = [results[i] for i in range(len(jobs))]
                    request.state.tokens = sum(r.stats.generated_tokens for r in ordered)
                    yield "".join(sse(o) for o in on_all(ordered))
            finally:
                for task, job in zip(tasks, jobs):
                    task.cancel()
                    job.cancel()
            if done_sentinel:
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def prompt_progress(p: tuple) -> dict:
    """llama-server's `prompt_progress` of a job's (total, cache, processed, ms)."""
    total, cache, processed, ms = p
    return {"total": total, "cache": cache, "processed": processed, "time_ms": round(ms, 3)}


LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}  # llama-server's


def ctx_of(request: Request) -> ServerContext:
    """The state `create_app` put on the app, from a route's request; 503 while the model loads."""
    ctx = request.app.state.ctx
    if ctx is None:
        raise ApiError("Loading model", status=503, type="unavailable_error")
    return ctx

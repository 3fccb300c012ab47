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
from ..engine.context_shift import ContextShift
from ..engine.text import TextPiece
from ..options import SamplingOptions
from . import stream_sessions
from .http import BODY_LIMIT, ApiError, error_body, log
from .image_parts import ImageSources
from .requests import RequestReader
from .responses import LiveTimings, ResponseShapes, sse
from .worker import Busy, Job, Result, ShuttingDown, Worker


@dataclass
class ServerContext:
    tokenizer: Any
    engine: Any
    worker: Worker
    defaults: SamplingOptions
    max_tokens: int  # the server's -n: a request's budget when it sets none (-1: the window)
    model_id: str
    body_limit: int = BODY_LIMIT
    max_predict_ms: int = 0  # --max-predict-ms
    reasoning_format: str = "auto"  # --reasoning-format: a request's default
    verbose: bool = False  # -v: chat replies carry `__verbose`
    model_path: str = ""  # the model's folder or file, for /props
    template_kwargs: dict = field(default_factory=dict)  # every chat template's variables (--reasoning...)
    reasoning_budget: int = -1  # --reasoning-budget
    aliases: list[str] = field(default_factory=list)  # --alias, for /v1/models
    tags: list[str] = field(default_factory=list)  # --tags, for /v1/models
    model_meta: dict = field(default_factory=dict)  # /v1/models' `meta` (model_meta.py)
    context_shift: ContextShift | None = None  # --context-shift (its --keep): requests' default
    embeddings: bool = False  # --embeddings: the embedding routes answer
    metrics_endpoint: bool = False  # --metrics: GET /metrics answers (501 without)
    reranking: bool = False  # --reranking: the rerank routes answer (routes_rerank.py)
    adapters: Any = None  # adapter_variants.AdapterVariants under --lora/--adapter-path (None: none)
    vision: Any = None  # a vision-language model's vision.prompts.Vision (None: text only)
    images: ImageSources = field(default_factory=ImageSources)  # --image-url-fetch, --media-path
    pooling: str = "last"  # --pooling
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
            eos_ids=tuple(self.engine.eos_ids),
            grammar_vocab=self.engine.vocab_size,
            template_kwargs=self.template_kwargs,
            reasoning_budget=self.reasoning_budget,
            context_shift=self.context_shift,
            min_draft=drafters.config.min_draft if (drafters := getattr(self.engine, "drafters", None)) else 0,
            vision=self.vision,
            images=self.images,
            adapters=self.adapters,
        )
        self.responses = ResponseShapes(self.tokenizer)
        # llama-server's form, b<build>-<commit>: here the version and a hash of version and model
        digest = hashlib.sha256(f"mlxcel-py {__version__} {self.model_id}".encode()).hexdigest()[:8]
        self.fingerprint = f"b{__version__}-{digest}"
        from .metrics import Metrics

        self.metrics = Metrics(self.worker, self.engine)
        if self.worker is not None:
            self.worker.metrics = self.metrics

    async def wake(self) -> None:
        """A sleeping server wakes for the routes that read the vocabulary or the template
        (tokenize, detokenize, token counts, /apply-template), as llama-server's do. Here the
        tokenizer stays loaded, so they would answer asleep; but a client counting tokens is
        about to generate, and clients read /props' is_sleeping as llama-server's rules set it.
        A failed load is the next request's error, not this route's."""
        if getattr(self.worker, "asleep", False):
            try:
                await self.worker.call(lambda: None)
            except Exception:
                pass

    def serves(self, on: bool, what: str, flag: str) -> None:
        """A route behind a switch (`flag`: --embeddings, --reranking) and on one process only:
        501 otherwise, in llama-server's words."""
        if not on:
            raise ApiError(
                f"This server does not support {what}. Start it with `{flag}`", status=501, type="not_supported_error"
            )
        if self.engine.channel is not None:
            raise ApiError(f"{what}: not served under --tp-size/--pp-size", status=501, type="not_supported_error")

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
        """SSE for one job: `stream_many` with one job and callbacks that take no index."""
        return self.stream_many(
            [job],
            request,
            lambda i, piece, lps: on_text(piece, lps),
            lambda i, r: on_done(r),
            lambda results: [],
            head=head,
            done_sentinel=done_sentinel,
            frame=frame,
            on_error=on_error,
            on_progress=on_progress,
        )

    def stream_many(
        self,
        jobs: list[Job],
        request: Request,
        on_text: Callable[[int, TextPiece, list], dict | list[dict]],
        on_done: Callable[[int, Result], dict | list[dict]],
        on_all: Callable[[list[Result]], dict | list[dict]],
        *,
        head: dict | list[dict] | None = None,
        done_sentinel: bool = True,
        frame: Callable[[dict], str] = sse,
        on_error: Callable[[str, str], dict] = error_body,
        on_progress: Callable[[dict], dict] | None = None,
    ) -> StreamingResponse:
        """SSE for one request's jobs (one, or `n` choices, a prompt batch): optional head frames,
        frames per text piece (and per prompt chunk with `on_progress`, for a job that asked for
        progress), each job's final frames, and `on_all`'s once every job is done; the callbacks
        get the job's index. Each returns one frame or a list; `frame` spells a frame (OpenAI's
        bare `data:` lines by default, Anthropic's `event:` + `data:`), `on_error` an error frame.
        An error ends the whole stream with an error frame; a client leaving cancels every job.
        A job that asked for `timings_per_token` gets `timings` on each of its text and progress
        frames."""
        self.admit_all(jobs)
        live = [LiveTimings(j) if j.timings_per_token else None for j in jobs]

        def frames(objs: dict | list[dict], extra: dict | None = None) -> str:
            objs = objs if isinstance(objs, list) else [objs]
            return "".join(frame({**o, **extra} if extra else o) for o in objs)

        def timed(t: dict | None) -> dict | None:
            return {"timings": t} if t is not None else None

        async def job_events():
            """(index, kind, payload) of every job's events, as they come."""
            if len(jobs) == 1:  # straight from the worker: no task or queue in between
                async for kind, payload in self.worker.submit(jobs[0]):
                    yield 0, kind, payload
                return
            queue: asyncio.Queue = asyncio.Queue()

            async def pump(i: int, job: Job) -> None:
                try:
                    async for kind, payload in self.worker.submit(job):
                        queue.put_nowait((i, kind, payload))
                finally:
                    queue.put_nowait((i, "end", None))

            tasks = [asyncio.create_task(pump(i, j)) for i, j in enumerate(jobs)]
            try:
                ended = 0
                while ended < len(jobs):
                    item = await queue.get()
                    if item[1] == "end":
                        ended += 1
                    else:
                        yield item
            finally:
                for task, job in zip(tasks, jobs):
                    task.cancel()
                    job.cancel()

        async def events():
            if head:
                yield frames(head)
            results: dict[int, Result] = {}
            lps: dict[int, list] = {}
            source = job_events()
            try:
                async for i, kind, payload in source:
                    if kind == "logprobs":
                        lps[i] = payload
                    elif kind == "progress":
                        if on_progress is not None:
                            t = live[i] and live[i].progress(payload)
                            yield frames(on_progress(prompt_progress(payload)), timed(t))
                    elif kind == "text":
                        t = live[i] and live[i].piece(payload.tokens)
                        yield frames(on_text(i, payload, lps.pop(i, [])), timed(t))
                    elif kind == "error":
                        shutdown = isinstance(payload, ShuttingDown)
                        why = str(payload) if shutdown else self.failed(payload)
                        yield frames(on_error(why, "unavailable_error" if shutdown else "server_error"))
                        break
                    else:
                        results[i] = payload
                        request.state.tokens = sum(r.stats.generated_tokens for r in results.values())
                        yield frames(on_done(i, payload))
                if len(results) == len(jobs):
                    tail = on_all([results[i] for i in range(len(jobs))])
                    if tail:
                        yield frames(tail)
            finally:
                await source.aclose()
            if done_sentinel:
                yield "data: [DONE]\n\n"

        conv_id = request.headers.get(stream_sessions.HEADER, "")
        streams = getattr(request.app.state, "streams", None)
        if conv_id and streams is not None:  # resumable: generated on whether or not the client stays
            from .routes_streams import replay

            return replay(streams.start(conv_id, events()), 0)
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

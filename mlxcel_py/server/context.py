"""What every route shares, kept on `app.state.ctx`: the loaded model's tokenizer and engine, the
worker, the server's defaults, and the steps from a parsed request to a finished job.

A request body is read strictly (`http.read_json`), checked for fields we cannot honour
(`schemas.refuse_unsupported`), validated by its pydantic model, then turned into a `Job`: prompt
ids (templating and tokenizing run off the event loop), sampling (request fields over the server
defaults, ranges checked by the CLI's own `validate.check_sampling`), the token budget (capped by
the server's `-n`), stops and logprobs. `collect` and `stream` hand the job to the worker; a client
that leaves cancels it. Token ids a client sends are checked against the vocabulary: MLX's
embedding lookup does no bounds check, so an id past it would crash the process.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from .. import __version__
from ..errors import UsageError
from ..options import SamplingOptions
from ..engine.prompting import render_messages
from ..engine.text import TextPiece
from ..validate import check_sampling
from . import schemas
from .http import BODY_LIMIT, ApiError, error_body, log, read_json
from .worker import Busy, Job, Result, Worker

Body = TypeVar("Body", bound=BaseModel)
HTTP_SAMPLING_NAMES = {"temp": "'temperature'", "top_p": "'top_p'", "top_k": "'top_k'", "min_p": "'min_p'",
                       "repetition_penalty": "'repeat_penalty'", "repeat_last_n": "'repeat_last_n'", "seed": "'seed'"}
ROLE_FOR_TEMPLATE = {"developer": "system"}  # OpenAI's newer name for the system turn


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes (token pieces that are not whole UTF-8). Built on
    first use: by then the tokenizer has imported transformers (importing it earlier prints noise)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


@dataclass
class ServerContext:
    tokenizer: Any
    engine: Any
    worker: Worker
    defaults: SamplingOptions
    max_tokens: int  # the server's -n: -1 no cap
    model_id: str
    body_limit: int = BODY_LIMIT
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        # the embedding's rows: a config may declare more than the tokenizer has (padding), never fewer
        self.vocab = self.engine.vocab_size or len(self.tokenizer.get_vocab())
        self.fingerprint = "fp_" + hashlib.sha256(f"mlxcel-py {__version__} {self.model_id}".encode()).hexdigest()[:12]
        from .metrics import Metrics

        self.metrics = Metrics(self.worker, self.engine)
        if self.worker is not None:
            self.worker.metrics = self.metrics

    # ---- request -> job --------------------------------------------------------------------
    async def parse(self, request: Request, model: type[Body]) -> Body:
        data = await read_json(request, self.body_limit)
        refused = schemas.refuse_unsupported(data)
        if refused:
            raise ApiError(refused, code="unsupported_field")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise ApiError(schemas.describe(exc)) from None

    def sampling(self, req: schemas.Sampling) -> SamplingOptions:
        d = self.defaults
        s = replace(
            d,
            temp=d.temp if req.temperature is None else req.temperature,
            top_p=d.top_p if req.top_p is None else req.top_p,
            top_k=d.top_k if req.top_k is None else req.top_k,
            min_p=d.min_p if req.min_p is None else req.min_p,
            seed=d.seed if req.seed is None else req.seed,
            repetition_penalty=next((v for v in (req.repeat_penalty, req.repetition_penalty) if v is not None),
                                    d.repetition_penalty),
        )
        try:
            check_sampling(s, HTTP_SAMPLING_NAMES)
        except UsageError as exc:
            raise ApiError(exc.message) from None
        return replace(s, seed=None) if s.seed == -1 else s  # llama-server: -1 means random

    def budget(self, req: schemas.Sampling, prompt: list[int]) -> int:
        n = req.requested_tokens()
        if n is not None and n < -1:
            raise ApiError(f"'max_tokens' must be -1 or >= 0, got {n}")
        if len(prompt) >= self.engine.context_length:
            raise ApiError(f"the prompt has {len(prompt)} tokens, which exceeds the context window "
                           f"({self.engine.context_length})", type="exceed_context_size_error")
        # the server's -n/--n-predict caps every request, as llama-server clamps n_predict
        if n is None or n == -1:
            return self.max_tokens
        return min(n, self.max_tokens) if self.max_tokens >= 0 else n

    def token_ids(self, values: list[int], key: str) -> list[int]:
        if not all(0 <= t < self.vocab for t in values):
            raise ApiError(f"'{key}' token ids must be integers in 0..{self.vocab - 1} (the model's vocabulary)")
        return list(values)

    def text_prompt(self, prompt: str | list) -> list[int]:
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return self.token_ids(prompt, "prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise ApiError("'prompt' must be a non-empty string (or a list of token ids)")
        return list(self.tokenizer.encode(prompt))

    def chat_prompt(self, messages: list[schemas.Message]) -> list[int]:
        turns = [{"role": ROLE_FOR_TEMPLATE.get(m.role, m.role), "content": m.text()} for m in messages]
        return render_messages(self.tokenizer, turns)

    def job(self, req: schemas.Sampling, prompt: list[int], logprobs: int | None = None) -> Job:
        return Job(prompt=prompt, max_tokens=self.budget(req, prompt), sampling=self.sampling(req),
                   stop=req.stops(), ignore_eos=req.ignore_eos, logprobs=logprobs)

    # ---- running a job ---------------------------------------------------------------------
    def admit(self, job: Job) -> None:
        """Into the worker's queue now, so a dead worker or a full queue answers before any body."""
        if not self.worker.alive:
            raise ApiError("the model worker is not running; see the server log", status=503, type="unavailable_error")
        try:
            self.worker.admit(job)
        except Busy as exc:
            raise ApiError(f"the server is busy ({exc}); retry later", status=503, type="unavailable_error",
                           headers={"Retry-After": "1"}) from None

    @staticmethod
    def failed(payload: Any) -> str:
        rid = uuid.uuid4().hex[:12]
        log(f"mlxcel serve: request {rid}: generation failed: {payload}")
        return f"generation failed (request id {rid})"

    async def collect(self, job: Job, request: Request) -> Result:
        """A non-streaming job's result; a client that hangs up cancels it (checked every 0.2 s)."""
        job.pieces = False  # text pieces would only be dropped here: the worker need not send them
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
                if kind == "error":
                    raise ApiError(self.failed(payload), status=500, type="server_error")
                if kind == "done":
                    result = payload
        finally:
            watcher.cancel()
        assert result is not None
        request.state.tokens = result.stats.generated_tokens  # for the access line
        return result

    def stream(self, job: Job, request: Request, on_text: Callable[[TextPiece, list], dict],
               on_done: Callable[[Result], dict], *, head: dict | None = None,
               done_sentinel: bool = True) -> StreamingResponse:
        """SSE for one job: an optional head frame, one frame per text piece, the final frame."""
        self.admit(job)

        async def events():
            if head is not None:
                yield sse(head)
            lps: list = []
            async for kind, payload in self.worker.submit(job):
                if kind == "logprobs":
                    lps = payload
                elif kind == "text":
                    yield sse(on_text(payload, lps))
                    lps = []
                elif kind == "error":
                    yield sse(error_body(self.failed(payload), "server_error"))
                else:
                    request.state.tokens = payload.stats.generated_tokens
                    yield sse(on_done(payload))
            if done_sentinel:
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- token text, bytes and logprobs in each API's shape --------------------------------
    def token_bytes(self, token_id: int) -> list[int]:
        tok = self.tokenizer
        raw = tok.convert_ids_to_tokens(token_id) if hasattr(tok, "convert_ids_to_tokens") else None
        if isinstance(raw, str):
            try:  # a byte-level BPE token spells its bytes in GPT-2's alphabet
                return list(bytes(_byte_decoder()[c] for c in raw))
            except KeyError:
                pass
        return list(tok.decode([token_id]).encode())

    def piece(self, token_id: int):
        text = self.tokenizer.decode([token_id])
        return self.token_bytes(token_id) if "\ufffd" in text else text  # bytes for part of a character

    def chat_logprobs(self, entries: list) -> dict:
        """OpenAI chat's `logprobs.content`: each token with its bytes and the top alternatives."""
        def one(t: int, lp: float) -> dict:
            return {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": self.token_bytes(t)}

        return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]}
                            for e in entries]}

    def legacy_logprobs(self, entries: list, offset: int = 0) -> dict:
        """OpenAI completions' `logprobs`: parallel lists, text offsets into the completion."""
        texts = [self.tokenizer.decode([e.token]) for e in entries]
        offsets = []
        for t in texts:
            offsets.append(offset)
            offset += len(t)
        return {"tokens": texts, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self.tokenizer.decode([t]): v for t, v in e.top} for e in entries],
                "text_offset": offsets}

    def native_probs(self, entries: list) -> list:
        """llama-server's `completion_probabilities` (its logprob format)."""
        def one(t: int, lp: float) -> dict:
            return {"id": t, "token": self.tokenizer.decode([t]), "bytes": self.token_bytes(t), "logprob": lp}

        return [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries]


LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}  # llama-server's


def ctx_of(request: Request) -> ServerContext:
    """The state `create_app` put on the app, from a route's request; 503 while the model loads."""
    ctx = request.app.state.ctx
    if ctx is None:
        raise ApiError("Loading model", status=503, type="unavailable_error")
    return ctx


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def usage(r: Result) -> dict:
    p = r.stats.prompt_tokens
    return {"prompt_tokens": p, "completion_tokens": r.stats.generated_tokens, "total_tokens": p + r.stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": r.stats.cached_tokens}}


def timings(stats: Any) -> dict:
    """llama-server's `timings`, plus the drafter's counters when a round drafted."""
    prompt_n = stats.prompt_tokens - stats.cached_tokens
    prompt_ms = stats.prefill_s * 1000
    pred_n = stats.generated_tokens
    pred_ms = max(stats.decode_s - stats.ttft_s + stats.prefill_s, 0.0) * 1000 if pred_n else 0.0
    t = {
        "cache_n": stats.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / (prompt_ms / 1000) if prompt_n and prompt_ms else 0.0,
        "predicted_n": pred_n,
        "predicted_ms": pred_ms,
        "predicted_per_token_ms": pred_ms / (pred_n - 1) if pred_n > 1 else 0.0,
        "predicted_per_second": (pred_n - 1) / (pred_ms / 1000) if pred_n > 1 and pred_ms else 0.0,
    }
    if stats.drafted_rounds > 0:
        t.update(draft_n=stats.proposed, draft_n_accepted=stats.accepted, draft_rounds=stats.drafted_rounds,
                 draft_kind=stats.draft_kind)
    return t

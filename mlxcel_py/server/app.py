"""FastAPI app: OpenAI routes, llama-server native routes, errors in the OpenAI shape.

Each request's sampling fields override the server defaults (the CLI flags); the request is
validated like CLI flags are, then handed to the single MLX worker. Requests that speculation
cannot serve exactly (logprobs, structured output) decode plainly. Every failure is a 4xx/5xx
with `{"error": {"message", "type", "code"}}`, and the server keeps serving.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..options import SamplingOptions
from ..prompting import render_messages
from ..text import TextPiece
from .worker import Job, Result, Worker


class ApiError(Exception):
    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.code = message, status, type, code


def error_body(message: str, type: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "code": code}}


def timings(stats: Any) -> dict:
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


def _num(body: dict, key: str, kind: type, default: Any) -> Any:
    if key not in body or body[key] is None:
        return default
    v = body[key]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else isinstance(v, int) and not isinstance(v, bool)
    if not ok:
        raise ApiError(f"'{key}' must be a {'number' if kind is float else 'integer'}, got {json.dumps(v)}")
    return kind(v)


def create_app(session: Any, worker: Worker, *, defaults: SamplingOptions, max_tokens: int, model_id: str,
               api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="mlxcel-py", docs_url=None, redoc_url=None)
    tok = session.tokenizer
    engine = session.engine
    # the embedding's rows: a config may declare more than the tokenizer has (padding), never fewer
    vocab = engine.vocab_size or len(tok.get_vocab())
    created = int(time.time())
    ids = {model_id, "default", str(session.target.resolved.path)}

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return JSONResponse(error_body(exc.message, exc.type, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request"}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return JSONResponse(error_body(f"invalid request: {first.get('msg')}" + (f" at '{where}'" if where else ""),
                                       "invalid_request_error"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key and request.url.path not in ("/health", "/"):
            header = request.headers.get("authorization", "")
            if header.removeprefix("Bearer ").strip() != api_key:
                kind = "missing_api_key" if not header else "invalid_api_key"
                return JSONResponse(error_body("invalid or missing API key", kind), status_code=401)
        return await call_next(request)

    async def body_of(request: Request) -> dict:
        try:
            data = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(f"malformed JSON body: {exc}")
        if not isinstance(data, dict):
            raise ApiError("the request body must be a JSON object")
        return data

    def check_model(body: dict) -> None:
        m = body.get("model")
        if m is not None and (not isinstance(m, str) or m not in ids):
            raise ApiError(f"model '{m}' is not served here; use '{model_id}'", status=404, type="not_found_error",
                           code="model_not_found")

    def sampling_of(body: dict) -> SamplingOptions:
        s = replace(
            defaults,
            temp=_num(body, "temperature", float, defaults.temp),
            top_p=_num(body, "top_p", float, defaults.top_p),
            top_k=_num(body, "top_k", int, defaults.top_k),
            min_p=_num(body, "min_p", float, defaults.min_p),
            seed=_num(body, "seed", int, defaults.seed),
            repetition_penalty=_num(body, "repeat_penalty", float, _num(body, "repetition_penalty", float, defaults.repetition_penalty)),
        )
        if s.seed is not None and s.seed < 0:
            s = replace(s, seed=None)  # llama-server: -1 means random
        if s.temp < 0:
            raise ApiError(f"'temperature' must be >= 0, got {s.temp}")
        if not 0 < s.top_p <= 1:
            raise ApiError(f"'top_p' must be in (0, 1], got {s.top_p}")
        if s.top_k < 0 or not 0 <= s.min_p <= 1 or s.repetition_penalty <= 0:
            raise ApiError("'top_k' must be >= 0, 'min_p' in [0, 1], 'repeat_penalty' > 0")
        return s

    def limits_of(body: dict, prompt: list[int]) -> int:
        n = _num(body, "max_tokens", int, None)
        if n is None:
            n = _num(body, "max_completion_tokens", int, None)
        if n is None:
            n = _num(body, "n_predict", int, max_tokens)
        if n < -1:
            raise ApiError(f"'max_tokens' must be -1 or >= 0, got {n}")
        if len(prompt) >= engine.context_length:
            raise ApiError(f"the prompt has {len(prompt)} tokens, which exceeds the context window "
                           f"({engine.context_length})", type="exceed_context_size_error")
        return n

    def stops_of(body: dict) -> list[str]:
        stop = body.get("stop")
        if stop is None:
            return []
        if isinstance(stop, str):
            return [stop]
        if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            return stop
        raise ApiError("'stop' must be a string or a list of strings")

    def eligible(body: dict) -> bool:
        return not (body.get("logprobs") or body.get("n_probs") or body.get("response_format")
                    or body.get("json_schema") or body.get("grammar"))

    def token_ids(value, key: str) -> list[int]:
        """Token ids a client sent: MLX's embedding lookup does no bounds check, so an id past the
        vocabulary would crash the process instead of failing the request."""
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in value):
            raise ApiError(f"'{key}' token ids must be integers in 0..{vocab - 1} (the model's vocabulary)")
        return list(value)

    def text_prompt(body: dict, key: str = "prompt") -> list[int]:
        p = body.get(key)
        if isinstance(p, list) and p and all(isinstance(t, int) for t in p):
            return token_ids(p, key)
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]
        if not isinstance(p, str) or not p:
            raise ApiError(f"'{key}' must be a non-empty string")
        return list(tok.encode(p))

    def chat_prompt(body: dict) -> list[int]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError("'messages' must be a non-empty list")
        out = []
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError("each message needs a 'role' and 'content'")
            content = m.get("content")
            if isinstance(content, list):
                parts = []
                for part in content:
                    if isinstance(part, dict) and part.get("type") == "text":
                        parts.append(str(part.get("text", "")))
                    else:
                        raise ApiError("this model takes text only: image, audio and other content parts are not supported")
                content = "".join(parts)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise ApiError("message 'content' must be a string or a list of text parts")
            out.append({"role": m["role"], "content": content})
        return render_messages(tok, out)

    def make_job(body: dict, prompt: list[int]) -> Job:
        return Job(prompt=prompt, max_tokens=limits_of(body, prompt), sampling=sampling_of(body),
                   stop=stops_of(body), speculative=eligible(body))

    async def collect(job: Job) -> Result:
        result = None
        async for kind, payload in worker.submit(job):
            if kind == "error":
                raise ApiError(f"generation failed: {payload}", status=500, type="server_error")
            if kind == "done":
                result = payload
        assert result is not None
        return result

    def sse(obj: Any) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    def stream(job: Job, on_text: Callable[[TextPiece], dict], on_done: Callable[[Result], dict], *,
               head: dict | None = None, done_sentinel: bool = True) -> StreamingResponse:
        """SSE for one job: an optional head frame, one frame per text piece, the final frame."""

        async def events():
            if head is not None:
                yield sse(head)
            async for kind, payload in worker.submit(job):
                if kind == "text":
                    yield sse(on_text(payload))
                elif kind == "error":
                    yield sse(error_body(f"generation failed: {payload}", "server_error"))
                else:
                    yield sse(on_done(payload))
            if done_sentinel:
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- routes ---------------------------------------------------------------------------
    @app.get("/health")
    @app.get("/")
    async def health():
        return {"status": "ok", "model": model_id,
                "batch": {"active_sequences": worker.active, "queue_depth": worker.queue_depth, "max_batch_size": 1},
                "context_size": engine.context_length}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "mlxcel-py"}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await body_of(request)
        content = body.get("content")
        if not isinstance(content, str):
            raise ApiError("'content' must be a string")
        return {"tokens": list(tok.encode(content, add_special_tokens=bool(body.get("add_special", False))))}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await body_of(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise ApiError("'tokens' must be a list of token ids")
        return {"content": tok.decode(token_ids(tokens, "tokens"))}

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request):
        body = await body_of(request)
        check_model(body)
        job = make_job(body, chat_prompt(body))
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        base = {"id": cid, "created": int(time.time()), "model": model_id, "system_fingerprint": None}
        if body.get("stream"):
            chunk = {**base, "object": "chat.completion.chunk"}
            return stream(
                job,
                lambda piece: {**chunk, "choices": [{"index": 0, "delta": {"content": piece.text}, "finish_reason": None}]},
                lambda r: {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": r.finish_reason}],
                           "usage": usage(r), "timings": timings(r.stats)},
                head={**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
            )
        r = await collect(job)
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                             "finish_reason": r.finish_reason, "logprobs": None}],
                "usage": usage(r), "timings": timings(r.stats)}

    def usage(r: Result) -> dict:
        p = r.stats.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": r.stats.generated_tokens,
                "total_tokens": p + r.stats.generated_tokens}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        check_model(body)
        job = make_job(body, text_prompt(body))
        cid = f"cmpl-{uuid.uuid4().hex[:24]}"
        base = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model_id}
        if body.get("stream"):
            return stream(
                job,
                lambda piece: {**base, "choices": [{"index": 0, "text": piece.text, "finish_reason": None, "logprobs": None}]},
                lambda r: {**base, "choices": [{"index": 0, "text": "", "finish_reason": r.finish_reason, "logprobs": None}],
                           "usage": usage(r), "timings": timings(r.stats)},
            )
        r = await collect(job)
        return {**base, "choices": [{"index": 0, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None}],
                "usage": usage(r), "timings": timings(r.stats)}

    def native(r: Result, prompt: str, n_eval: int) -> dict:
        stop_type = {"length": "limit"}.get(r.finish_reason, "word" if r.stop_word else "eos")
        return {"index": 0, "content": r.text, "tokens": [], "id_slot": 0, "stop": True, "model": model_id,
                "tokens_predicted": r.stats.generated_tokens, "tokens_evaluated": n_eval,
                "generation_settings": {}, "prompt": prompt, "has_new_line": "\n" in r.text, "truncated": False,
                "stop_type": stop_type, "stopping_word": r.stop_word or "", "tokens_cached": r.stats.cached_tokens,
                "timings": timings(r.stats)}

    @app.post("/completion")
    @app.post("/completions")
    async def native_completion(request: Request):
        body = await body_of(request)
        check_model(body)
        prompt = text_prompt(body)
        job = make_job(body, prompt)
        ptext = body.get("prompt") if isinstance(body.get("prompt"), str) else ""
        if body.get("stream"):
            # the native stream ends with the full object and has no [DONE] sentinel
            return stream(
                job,
                lambda piece: {"index": 0, "content": piece.text, "tokens": [], "stop": False, "id_slot": 0,
                               "tokens_predicted": piece.tokens, "tokens_evaluated": len(prompt)},
                lambda r: {**native(r, ptext, len(prompt)), "content": ""},
                done_sentinel=False,
            )
        r = await collect(job)
        return native(r, ptext, len(prompt))

    return app

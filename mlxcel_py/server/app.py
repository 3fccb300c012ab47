"""FastAPI app: OpenAI routes, llama-server native routes, errors in the OpenAI shape.

Each request's sampling fields override the server defaults (the CLI flags); the request is
validated like CLI flags are, then handed to the single MLX worker. Fields whose meaning we cannot
honour yet (n > 1, structured output, tools, logit_bias) are refused by name rather than ignored;
logprobs (OpenAI's `logprobs`/`top_logprobs`, llama-server's `n_probs`) are the target's own. Bodies are bounded and parsed strictly (no NaN/Infinity, roles from a fixed set), and
access is checked first (`security`: keys, Host on loopback, JSON content type). Every failure is
a 4xx/5xx with `{"error": {"message", "type", "code"}}`, internal ones carrying only a request id,
and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import sys
import time
import uuid
from dataclasses import replace
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..options import SamplingOptions
from ..prompting import render_messages
from ..text import TextPiece
from .security import AccessPolicy, is_json_content_type
from .worker import Busy, Job, Result, Worker

def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes (for /tokenize pieces that are not whole UTF-8)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_DECODER = _byte_decoder()
BODY_LIMIT = 8 * 2**20  # bytes; a chat history of this size is far past any context window here
MAX_STOPS, MAX_STOP_CHARS = 32, 1000
ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool", "developer": "system"}
# fields whose meaning we cannot honour yet: refused by name instead of ignored behind a 200
UNSUPPORTED = ("json_schema", "grammar", "tools", "functions", "logit_bias")
MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error", code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.code, self.headers = message, status, type, code, headers


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


def _echo(value: Any, limit: int = 60) -> str:
    """A client's value in an error message, cut short (a 1 MB string is not echoed back)."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def _num(body: dict, key: str, kind: type, default: Any) -> Any:
    if key not in body or body[key] is None:
        return default
    v = body[key]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else isinstance(v, int) and not isinstance(v, bool)
    if not ok:
        raise ApiError(f"'{key}' must be a {'number' if kind is float else 'integer'}, got {_echo(v)}")
    if kind is float and not math.isfinite(v):
        raise ApiError(f"'{key}' must be a finite number")
    return kind(v)


def _no_constants(name: str) -> Any:
    raise ApiError(f"malformed JSON body: {name} is not a number JSON allows")


def refuse_unsupported(body: dict) -> None:
    """Fields that change what a response means, which we cannot honour: 400 naming the field."""
    n = body.get("n")
    if n is not None and n != 1:
        raise ApiError(f"'n' must be 1 (one choice per request), got {_echo(n)}", code="unsupported_field")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise ApiError("'response_format' (structured output) is not supported; omit it or use {\"type\": \"text\"}",
                       code="unsupported_field")
    for key in UNSUPPORTED:
        if body.get(key):
            raise ApiError(f"'{key}' is not supported by this server", code="unsupported_field")


def _top_count(body: dict, key: str) -> int | None:
    n = _num(body, key, int, None)
    if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
        raise ApiError(f"'{key}' must be between 0 and {MAX_TOP_LOGPROBS}, got {n}")
    return n


def logprobs_request(body: dict, route: str) -> int | None:
    """How many top alternatives each token's logprob entry lists, or None for no logprobs.
    OpenAI chat: logprobs (bool) + top_logprobs; legacy completions: logprobs (int); native: n_probs."""
    if route == "chat":
        want = body.get("logprobs")
        if want is not None and not isinstance(want, bool):
            raise ApiError("'logprobs' must be true or false")
        top = _top_count(body, "top_logprobs")
        if top is not None and not want:
            raise ApiError("'top_logprobs' needs 'logprobs': true")
        return (top or 0) if want else None
    if route == "completions":
        return _top_count(body, "logprobs")
    n = _top_count(body, "n_probs")
    return n if n else None


def log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class Guard:
    """Host, key, content type and size checks before any route; any failure that is not already
    an HTTP error becomes a 500 carrying a request id (the details go to the server log only).

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware wraps the
    request's receive channel, and a route behind it cannot see its client disconnect (which is
    how a non-streaming request is cancelled)."""

    def __init__(self, app, *, access: AccessPolicy, body_limit: int, access_log: bool):
        self.app, self.access, self.body_limit, self.access_log = app, access, body_limit, access_log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        method, path = scope["method"], scope["path"]
        refusal = self.check(method, path, headers)
        if refusal is not None:
            return await refusal(scope, receive, send)
        rid = uuid.uuid4().hex[:12]
        start = time.perf_counter()
        state = {"status": None}

        async def tracked(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # a bug or a library failure: never echo its text to the client
            log(f"mlxcel serve: request {rid} {method} {path} failed: {type(exc).__name__}: {exc}")
            if state["status"] is None:
                state["status"] = 500
                await JSONResponse(error_body(f"internal server error (request id {rid})", "server_error"),
                                   status_code=500)(scope, receive, send)
        if self.access_log:  # time to the end of the response (a stream's whole body)
            client = scope.get("client")
            tokens = scope.get("state", {}).get("tokens")  # set by generation routes (request.state)
            log(f"{client[0] if client else '-'} {method} {path} {state['status']}"
                f"{f' {tokens} tokens' if tokens is not None else ''} {(time.perf_counter() - start) * 1000:.0f} ms")

    def check(self, method: str, path: str, headers) -> JSONResponse | None:
        if not self.access.host_allowed(headers.get("host")):
            return JSONResponse(error_body("the Host header must name this machine (loopback)", "invalid_request_error"),
                                status_code=403)
        if not self.access.authorized(path, headers):
            return JSONResponse({"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
                                status_code=401)
        if method == "POST":
            if not is_json_content_type(headers.get("content-type")):
                return JSONResponse(error_body("send the body as JSON with 'Content-Type: application/json'",
                                               "invalid_request_error"), status_code=415)
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.body_limit):
                return JSONResponse(error_body(f"the request body is larger than {self.body_limit} bytes",
                                               "invalid_request_error"), status_code=413)
        return None


def create_app(session: Any, worker: Worker, *, defaults: SamplingOptions, max_tokens: int, model_id: str,
               access: AccessPolicy = AccessPolicy(), cors_origins: tuple[str, ...] = (),
               body_limit: int = BODY_LIMIT, access_log: bool = False) -> FastAPI:
    app = FastAPI(title="mlxcel-py", docs_url=None, redoc_url=None)
    tok = session.tokenizer
    engine = session.engine
    # the embedding's rows: a config may declare more than the tokenizer has (padding), never fewer
    vocab = engine.vocab_size or len(tok.get_vocab())
    created = int(time.time())
    fingerprint = "fp_" + hashlib.sha256(f"mlxcel-py {__version__} {model_id}".encode()).hexdigest()[:12]

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return JSONResponse(error_body(exc.message, exc.type, exc.code), status_code=exc.status, headers=exc.headers)

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

    async def body_of(request: Request) -> dict:
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > body_limit:
                raise ApiError(f"the request body is larger than {body_limit} bytes", status=413)
        try:
            data = json.loads(bytes(raw) or b"{}", parse_constant=_no_constants)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(f"malformed JSON body: {exc}")
        except RecursionError:
            raise ApiError("malformed JSON body: nested too deeply")
        except ValueError as exc:  # e.g. an integer with thousands of digits
            raise ApiError(f"malformed JSON body: {str(exc).splitlines()[0][:120]}")
        if not isinstance(data, dict):
            raise ApiError("the request body must be a JSON object")
        try:  # JSON may spell a lone UTF-16 surrogate ("\\ud800"); no tokenizer can encode one
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError("malformed JSON body: a string holds a lone UTF-16 surrogate (not valid Unicode text)")
        return data

    def check_model(body: dict) -> None:
        # any name is served by the one loaded model, as llama-server does (OpenAI clients send
        # names like gpt-3.5-turbo); only its type is checked
        m = body.get("model")
        if m is not None and not isinstance(m, str):
            raise ApiError(f"'model' must be a string, got {_echo(m)}")
        refuse_unsupported(body)

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
            n = _num(body, "n_predict", int, None)
        if n is not None and n < -1:
            raise ApiError(f"'max_tokens' must be -1 or >= 0, got {n}")
        # the server's -n/--n-predict caps every request, as llama-server clamps n_predict
        if n is None or n == -1:
            n = max_tokens
        elif max_tokens >= 0:
            n = min(n, max_tokens)
        if len(prompt) >= engine.context_length:
            raise ApiError(f"the prompt has {len(prompt)} tokens, which exceeds the context window "
                           f"({engine.context_length})", type="exceed_context_size_error")
        return n

    def stops_of(body: dict) -> list[str]:
        stop = body.get("stop")
        if stop is None:
            return []
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ApiError("'stop' must be a string or a list of strings")
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ApiError(f"'stop' takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
        return [s for s in stops if s]

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
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise ApiError(f"messages[{i}] must be an object with 'role' and 'content'")
            role = m.get("role")
            if not isinstance(role, str) or role not in ROLES:
                # a free-form role would be rendered into the template as is (and could forge a turn)
                raise ApiError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {_echo(role)}")
            content = m.get("content")
            if isinstance(content, list):
                parts = []
                for part in content:
                    if not isinstance(part, dict) or part.get("type") != "text":
                        raise ApiError(f"messages[{i}].content: this model takes text parts only "
                                       f"(image, audio and other parts are not supported)")
                    if not isinstance(part.get("text"), str):
                        raise ApiError(f"messages[{i}].content: a text part needs a string 'text'")
                    parts.append(part["text"])
                content = "".join(parts)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise ApiError(f"messages[{i}].content must be a string or a list of text parts")
            out.append({"role": ROLES[role], "content": content})
        return render_messages(tok, out)

    def make_job(body: dict, prompt: list[int], logprobs: int | None = None) -> Job:
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise ApiError("'ignore_eos' must be true or false")
        return Job(prompt=prompt, max_tokens=limits_of(body, prompt), sampling=sampling_of(body),
                   stop=stops_of(body), ignore_eos=ignore_eos, logprobs=logprobs)

    def failed(payload: Any) -> str:
        rid = uuid.uuid4().hex[:12]
        log(f"mlxcel serve: request {rid}: generation failed: {payload}")
        return f"generation failed (request id {rid})"

    def admit(job: Job) -> None:
        """Into the worker's queue now, so a dead worker or a full queue answers before any body."""
        if not worker.alive:
            raise ApiError("the model worker is not running; see the server log", status=503, type="unavailable_error")
        try:
            worker.admit(job)
        except Busy as exc:
            raise ApiError(f"the server is busy ({exc}); retry later", status=503, type="unavailable_error",
                           headers={"Retry-After": "1"}) from None

    async def collect(job: Job, request: Request) -> Result:
        """A non-streaming job's result; a client that hangs up cancels it (checked every 0.2 s)."""
        admit(job)

        async def watch() -> None:
            while not job.cancelled.is_set():
                if await request.is_disconnected():
                    job.cancel()
                    return
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch())
        result = None
        try:
            async for kind, payload in worker.submit(job):
                if kind == "error":
                    raise ApiError(failed(payload), status=500, type="server_error")
                if kind == "done":
                    result = payload
        finally:
            watcher.cancel()
        assert result is not None
        request.state.tokens = result.stats.generated_tokens  # for the access line
        return result

    def sse(obj: Any) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    def stream(job: Job, request: Request, on_text: Callable[[TextPiece, list], dict],
               on_done: Callable[[Result], dict], *, head: dict | None = None,
               done_sentinel: bool = True) -> StreamingResponse:
        """SSE for one job: an optional head frame, one frame per text piece, the final frame."""

        admit(job)

        async def events():
            if head is not None:
                yield sse(head)
            lps: list = []
            async for kind, payload in worker.submit(job):
                if kind == "logprobs":
                    lps = payload
                elif kind == "text":
                    yield sse(on_text(payload, lps))
                    lps = []
                elif kind == "error":
                    yield sse(error_body(failed(payload), "server_error"))
                else:
                    request.state.tokens = payload.stats.generated_tokens
                    yield sse(on_done(payload))
            if done_sentinel:
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- routes ---------------------------------------------------------------------------
    @app.get("/health")
    @app.get("/")
    async def health():
        if not worker.alive:  # llama-server's shape for a server that cannot answer
            why = f"warmup failed: {worker.warmup_error}" if worker.warmup_error else "the model worker stopped"
            return JSONResponse({"error": {"code": 503, "message": why, "type": "unavailable_error"}}, status_code=503)
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
        ids = list(await asyncio.to_thread(tok.encode, content, add_special_tokens=bool(body.get("add_special", False))))
        if not body.get("with_pieces"):
            return {"tokens": ids}
        # llama-server's shape: each id with its piece (a string, or its bytes when not valid UTF-8)
        return {"tokens": [{"id": i, "piece": piece(i)} for i in ids]}

    def piece(token_id: int):
        text = tok.decode([token_id])
        return token_bytes(token_id) if "\ufffd" in text else text  # bytes for part of a character

    def token_bytes(token_id: int) -> list[int]:
        raw = tok.convert_ids_to_tokens(token_id) if hasattr(tok, "convert_ids_to_tokens") else None
        if isinstance(raw, str):
            try:  # a byte-level BPE token spells its bytes in GPT-2's alphabet
                return list(bytes(_BYTE_DECODER[c] for c in raw))
            except KeyError:
                pass
        return list(tok.decode([token_id]).encode())

    def chat_logprobs(entries: list) -> dict:
        """OpenAI chat's `logprobs.content`: each token with its bytes and the top alternatives."""
        def one(t: int, lp: float) -> dict:
            return {"token": tok.decode([t]), "logprob": lp, "bytes": token_bytes(t)}

        return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]}
                            for e in entries]}

    def legacy_logprobs(entries: list, offset: int = 0) -> dict:
        """OpenAI completions' `logprobs`: parallel lists, text offsets into the completion."""
        texts = [tok.decode([e.token]) for e in entries]
        offsets = []
        for t in texts:
            offsets.append(offset)
            offset += len(t)
        return {"tokens": texts, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{tok.decode([t]): v for t, v in e.top} for e in entries], "text_offset": offsets}

    def native_probs(entries: list) -> list:
        """llama-server's `completion_probabilities` (its logprob format)."""
        def one(t: int, lp: float) -> dict:
            return {"id": t, "token": tok.decode([t]), "bytes": token_bytes(t), "logprob": lp}

        return [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries]

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
        lp = logprobs_request(body, "chat")
        job = make_job(body, await asyncio.to_thread(chat_prompt, body), lp)  # templating off the event loop
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        base = {"id": cid, "created": int(time.time()), "model": model_id, "system_fingerprint": fingerprint}
        if body.get("stream"):
            chunk = {**base, "object": "chat.completion.chunk"}
            return stream(
                job, request,
                lambda piece, lps: {**chunk, "choices": [{"index": 0, "delta": {"content": piece.text}, "finish_reason": None,
                                                          "logprobs": chat_logprobs(lps) if lp is not None else None}]},
                lambda r: {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": r.finish_reason}],
                           "usage": usage(r), "timings": timings(r.stats)},
                head={**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
            )
        r = await collect(job, request)
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                             "finish_reason": r.finish_reason,
                             "logprobs": chat_logprobs(r.logprobs) if lp is not None else None}],
                "usage": usage(r), "timings": timings(r.stats)}

    def usage(r: Result) -> dict:
        p = r.stats.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": r.stats.generated_tokens,
                "total_tokens": p + r.stats.generated_tokens}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        check_model(body)
        lp = logprobs_request(body, "completions")
        job = make_job(body, await asyncio.to_thread(text_prompt, body), lp)
        cid = f"cmpl-{uuid.uuid4().hex[:24]}"
        base = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model_id,
                "system_fingerprint": fingerprint}
        if body.get("stream"):
            sent = [0]  # characters streamed so far: text_offset continues across chunks

            def chunk(piece: TextPiece, lps: list) -> dict:
                out = legacy_logprobs(lps, sent[0]) if lp is not None else None
                sent[0] += len(piece.text)
                return {**base, "choices": [{"index": 0, "text": piece.text, "finish_reason": None, "logprobs": out}]}

            return stream(
                job, request,
                chunk,
                lambda r: {**base, "choices": [{"index": 0, "text": "", "finish_reason": r.finish_reason, "logprobs": None}],
                           "usage": usage(r), "timings": timings(r.stats)},
            )
        r = await collect(job, request)
        return {**base, "choices": [{"index": 0, "text": r.text, "finish_reason": r.finish_reason,
                                     "logprobs": legacy_logprobs(r.logprobs) if lp is not None else None}],
                "usage": usage(r), "timings": timings(r.stats)}

    def native(r: Result, prompt: str, n_eval: int, return_tokens: bool = False, probs: bool = False) -> dict:
        stop_type = {"length": "limit"}.get(r.finish_reason, "word" if r.stop_word else "eos")
        extra = {"completion_probabilities": native_probs(r.logprobs)} if probs else {}
        return {**extra, "index": 0, "content": r.text, "tokens": list(r.tokens) if return_tokens else [], "id_slot": 0,
                "stop": True, "model": model_id,
                "tokens_predicted": r.stats.generated_tokens, "tokens_evaluated": n_eval,
                "generation_settings": {}, "prompt": prompt, "has_new_line": "\n" in r.text, "truncated": False,
                "stop_type": stop_type, "stopping_word": r.stop_word or "", "tokens_cached": r.stats.cached_tokens,
                "timings": timings(r.stats)}

    @app.post("/completion")
    @app.post("/completions")
    async def native_completion(request: Request):
        body = await body_of(request)
        check_model(body)
        prompt = await asyncio.to_thread(text_prompt, body)
        lp = logprobs_request(body, "native")
        job = make_job(body, prompt, lp)
        want_tokens, probs = body.get("return_tokens") is True, lp is not None
        ptext = body.get("prompt") if isinstance(body.get("prompt"), str) else ""
        if body.get("stream"):
            # the native stream ends with the full object and has no [DONE] sentinel
            return stream(
                job, request,
                lambda piece, lps: {"index": 0, "content": piece.text, "tokens": [], "stop": False, "id_slot": 0,
                                    "tokens_predicted": piece.tokens, "tokens_evaluated": len(prompt),
                                    **({"completion_probabilities": native_probs(lps)} if probs else {})},
                lambda r: {**native(r, ptext, len(prompt), return_tokens=want_tokens), "content": ""},
                done_sentinel=False,
            )
        r = await collect(job, request)
        return native(r, ptext, len(prompt), return_tokens=want_tokens, probs=probs)

    app.add_middleware(Guard, access=access, body_limit=body_limit, access_log=access_log)
    if cors_origins:  # added last, so it is outermost: preflight OPTIONS never reach the key check
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Api-Key"])
    return app

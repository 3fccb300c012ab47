"""HTTP plumbing shared by every route: the error type and shape, strict body reading, the guard.

Every failure is `{"error": {"message", "type", "code"}}` with a 4xx/5xx status. Bodies are read
with a size bound and parsed strictly (no NaN/Infinity, no lone surrogates; deep nesting and
giant integers are 400s, not 500s). `Guard` checks access first (`security`: Host on loopback,
keys, JSON content type, Content-Length) and turns any unexpected exception into a 500 that
carries a request id, logging the details on stderr only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from ..inputs.digits import whole_number
from .security import AccessPolicy, CorsPolicy

BODY_LIMIT = 8 * 2**20  # bytes; a chat history of this size is far past any context window here


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict | None = None,
        extra: dict | None = None,
    ):
        super().__init__(message)
        self.message, self.status, self.type, self.code, self.headers = message, status, type, code, headers
        self.extra = extra or {}  # more fields of the error object (llama-server's n_prompt_tokens, n_ctx)


def error_body(message: str, type: str, code: str | None = None, extra: dict | None = None) -> dict:
    return {"error": {"message": message, "type": type, "code": code, **(extra or {})}}


def log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _no_constants(name: str) -> Any:
    raise ApiError(f"malformed JSON body: {name} is not a number JSON allows")


# seconds for a whole request body to arrive (a slow upload holds a connection; MLXCEL_BODY_TIMEOUT)
BODY_TIMEOUT = float(os.environ.get("MLXCEL_BODY_TIMEOUT", "30"))


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, read at most `limit` bytes far (chunked bodies included) and within
    BODY_TIMEOUT seconds."""
    raw = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            raw.extend(chunk)
            if len(raw) > limit:
                raise ApiError(f"the request body is larger than {limit} bytes", status=413)

    try:
        await asyncio.wait_for(read(), BODY_TIMEOUT)
    except asyncio.TimeoutError:
        raise ApiError(f"the request body did not arrive within {BODY_TIMEOUT:g} s", status=408) from None
    return bytes(raw)


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object (`read_body`), parsed strictly (`parse_json`)."""
    return parse_json(await read_body(request, limit))


def parse_json(raw: bytes, *, array: bool = False) -> Any:
    """A body's bytes as a JSON object (or, `array`, a JSON array: POST /lora-adapters), strictly:
    no NaN or Infinity, no lone surrogates, and deep nesting or giant numbers a 400, never a 500."""
    try:
        data = json.loads(raw or b"{}", parse_constant=_no_constants)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise ApiError("malformed JSON body: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with thousands of digits
        raise ApiError(f"malformed JSON body: {str(exc).splitlines()[0][:120]}") from None
    if array and not isinstance(data, list):
        raise ApiError("the request body must be a JSON array")
    if not array and not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    try:  # JSON may spell a lone UTF-16 surrogate ("\ud800"); no tokenizer can encode one
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError("malformed JSON body: a string holds a lone UTF-16 surrogate (not valid Unicode text)") from None
    return data


# headers that describe one connection, never passed from one to the next (RFC 9110 7.6.1)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


async def relay(upstream: Any, headers: dict, after: Callable[[], Awaitable[None]]) -> Response:
    """An httpx streamed answer handed to the client as it comes (its bytes as sent, content
    encoding included); `after` runs once, after `upstream` is closed: when the relay ends, or,
    for a client that left before the body, as the response's background task (the relay's own
    `finally` never runs then). A 204 or 304 is answered without a body."""
    done = False

    async def finish() -> None:
        nonlocal done
        if not done:
            done = True
            await upstream.aclose()
            await after()

    if upstream.status_code in (204, 304):
        await finish()
        return Response(status_code=upstream.status_code, headers=headers)

    async def body():
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await finish()

    return StreamingResponse(
        body(), status_code=upstream.status_code, headers=headers, background=BackgroundTask(finish)
    )


class Cors:
    """CORS outermost, as llama-server answers it: every OPTIONS gets a 200 before any key or Host
    check (a browser's preflight carries no key) with the allowed methods, headers and credentials;
    an allowed Origin is reflected on every response (with credentials unless
    --no-cors-credentials), and a refused one simply gets no Access-Control-Allow-Origin, so the
    browser refuses the call."""

    def __init__(self, app, *, policy: CorsPolicy):
        self.app, self.policy = app, policy

    @staticmethod
    def origin_headers(origin: str) -> list[tuple[bytes, bytes]]:
        # spelled as llama-server sends them: names are case-insensitive, but clients that copy
        # headers into a plain dict (llama.cpp's own test suite) look them up by this spelling
        return [(b"Access-Control-Allow-Origin", origin.encode("latin-1")), (b"Vary", b"Origin")]

    def allow_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        out = self.origin_headers(origin)
        if self.policy.credentials:
            out.append((b"Access-Control-Allow-Credentials", b"true"))
        return out

    def preflight_headers(self, origin: str | None, allowed: bool) -> list[tuple[bytes, bytes]]:
        out = [
            (b"Content-Length", b"0"),
            (b"Allow", b"GET, POST, OPTIONS"),
            (b"Access-Control-Allow-Credentials", b"true" if self.policy.credentials else b"false"),
            (b"Access-Control-Allow-Methods", self.policy.methods.encode("latin-1")),
            (b"Access-Control-Allow-Headers", self.policy.headers.encode("latin-1")),
            (b"Access-Control-Max-Age", b"600"),
        ]
        return out + (self.origin_headers(origin) if allowed and origin else [])

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        origin = headers.get("origin")
        allowed = self.policy.allows(origin, headers.get("host"))
        if scope["method"] == "OPTIONS":
            await send(
                {"type": "http.response.start", "status": 200, "headers": self.preflight_headers(origin, allowed)}
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if not allowed:
            return await self.app(scope, receive, send)

        async def with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.allow_headers(origin)]}
            await send(message)

        await self.app(scope, receive, with_cors)


class Guard:
    """Host, key, content type and size checks before any route; any failure that is not already
    an HTTP error becomes a 500 carrying a request id (the details go to the server log only).
    One access line per request unless `access_log` is off.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware wraps the
    request's receive channel, and a route behind it cannot see its client disconnect (which is
    how a non-streaming request is cancelled)."""

    def __init__(
        self, app, *, access: AccessPolicy, body_limit: int, access_log: bool, cors: CorsPolicy = CorsPolicy(())
    ):
        self.app, self.access, self.body_limit, self.access_log = app, access, body_limit, access_log
        self.cors = cors

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
        except asyncio.CancelledError:
            # shutdown past --shutdown-grace cancels requests in flight: one line, not a traceback
            # (the request ends here; its worker job is cancelled by the route's own cleanup)
            log(f"mlxcel serve: request {rid} {method} {path} cancelled at shutdown")
            if state["status"] is None:  # the client gets an answer, not a dropped connection
                await JSONResponse(error_body("the server is shutting down", "unavailable_error"), status_code=503)(
                    scope, receive, send
                )
            return
        except ClientDisconnect:
            # the client hung up before its body arrived: its doing, not a server failure (nginx's
            # 499); nothing to answer, and no job was made, so /metrics counts nothing
            state["status"] = 499
            log(f"mlxcel serve: request {rid} {method} {path}: client closed the connection (499)")
        except Exception as exc:  # a bug or a library failure: never echo its text to the client
            log(f"mlxcel serve: request {rid} {method} {path} failed: {type(exc).__name__}: {exc}")
            if state["status"] is None:
                state["status"] = 500
                await JSONResponse(
                    error_body(f"internal server error (request id {rid})", "server_error"), status_code=500
                )(scope, receive, send)
        if self.access_log:  # time to the end of the response (a stream's whole body)
            client = scope.get("client")
            tokens = scope.get("state", {}).get("tokens")  # set by generation routes (request.state)
            log(
                f"{client[0] if client else '-'} {method} {path} {state['status']}"
                f"{f' {tokens} tokens' if tokens is not None else ''} {(time.perf_counter() - start) * 1000:.0f} ms"
            )

    def check(self, method: str, path: str, headers) -> JSONResponse | None:
        if not self.access.host_allowed(headers.get("host")):
            return JSONResponse(
                error_body("the Host header must name this machine (loopback)", "invalid_request_error"),
                status_code=403,
            )
        if not self.access.authorized(path, headers):
            return JSONResponse(
                {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}, status_code=401
            )
        origin = headers.get("origin")
        if method not in ("GET", "HEAD") and origin is not None and not self.cors.allows(origin, headers.get("host")):
            # a browser page on an origin CORS does not allow: a cross-site "simple" POST (a form,
            # text/plain) needs no preflight, and it must not reach the model
            return JSONResponse(
                error_body(
                    f"requests from the web page at {origin[:100]} are not allowed; "
                    "start the server with --cors-origins naming that origin to allow it",
                    "invalid_request_error",
                ),
                status_code=403,
            )
        if method == "POST":
            # a body without a JSON content type (plain `curl -d`, no Origin) is read as JSON, as
            # llama-server does
            length = headers.get("content-length")
            if length is not None and (not whole_number(length) or int(length) > self.body_limit):
                return JSONResponse(
                    error_body(f"the request body is larger than {self.body_limit} bytes", "invalid_request_error"),
                    status_code=413,
                )
        return None

"""The FastAPI app, wired: routes by API family, shared state, error handlers, access checks.

`create_app` only assembles: the loaded model and worker go on `app.state.ctx` (`context`; None
while the model loads, and every route answers 503 "Loading model" as llama-server does), the
OpenAI routes (`routes_openai`) and llama-server's native ones (`routes_native`) are included,
every error becomes `{"error": {...}}`, and `http.Guard` (Host, keys, content type, size, request
ids for 500s, the access line) wraps it all, with `http.Cors` outermost (preflights before keys).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..options import SamplingOptions
from . import (
    cors_proxy,
    routes_anthropic,
    routes_embeddings,
    routes_native,
    routes_openai,
    routes_rerank,
    routes_responses,
    routes_slots,
    routes_streams,
)
from . import webui as webui_routes
from .context import ServerContext
from .http import BODY_LIMIT, ApiError, Cors, Guard, error_body
from .security import AccessPolicy, CorsPolicy
from .stream_sessions import Sessions
from .tools import routes as tools_routes
from .worker import Worker


def create_app(
    session: Any = None,
    worker: Worker | None = None,
    *,
    defaults: SamplingOptions = SamplingOptions(),
    max_tokens: int = -1,
    model_id: str = "",
    access: AccessPolicy = AccessPolicy(),
    cors: CorsPolicy = CorsPolicy(),
    body_limit: int = BODY_LIMIT,
    access_log: bool = False,
    webui: bool = True,
    slots: bool = True,
) -> FastAPI:
    """Without a session the app is loading: every route answers 503 until `app.state.ctx` is set."""
    app = FastAPI(title="mlxcel-py", docs_url=None, redoc_url=None)
    app.state.body_limit = body_limit
    app.state.webui = webui
    app.state.slots = slots
    app.state.slot_dir = None  # --slot-save-path, as a Path (main sets it)
    app.state.api_keys = access.api_keys  # never forwarded by the MCP CORS proxy
    app.state.mcp_proxy, app.state.mcp_proxy_allow = False, ()  # --ui-mcp-proxy (main sets them)
    app.state.tools = None  # --tools: a tools.ServerTools (main sets it)
    app.state.streams = Sessions()  # resumable streams (X-Conversation-Id), the model's or not
    app.state.ctx = (
        None
        if session is None
        else ServerContext(
            session.tokenizer, session.engine, worker, defaults, max_tokens, model_id, body_limit=body_limit
        )
    )

    install_error_handlers(app)
    app.include_router(routes_openai.router)
    app.include_router(routes_native.router)
    app.include_router(routes_anthropic.router)  # /v1/messages, /v1/messages/count_tokens
    app.include_router(routes_responses.router)  # /v1/responses
    app.include_router(routes_embeddings.router)  # /v1/embeddings, /embedding (--embeddings)
    app.include_router(routes_rerank.router)  # /rerank, /v1/rerank (--reranking)
    app.include_router(cors_proxy.router)  # /cors-proxy (--ui-mcp-proxy)
    app.include_router(routes_slots.router)  # POST /slots/{id}: slot files (--slot-save-path)
    app.include_router(routes_streams.router)  # /v1/stream, /v1/streams/lookup (X-Conversation-Id)
    app.include_router(tools_routes.router)  # GET/POST /tools (--tools)
    app.include_router(webui_routes.router)  # / (the chat page, or health) and /props
    app.add_middleware(Guard, access=access, body_limit=body_limit, access_log=access_log, cors=cors)
    app.add_middleware(Cors, policy=cors)  # added last, so outermost: preflights never reach the key check
    return app


def install_error_handlers(app: FastAPI) -> None:
    """Every error as `{"error": {...}}`: ApiError with its status, Starlette's 404/405 alike."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        body = error_body(exc.message, exc.type, exc.code, exc.extra)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

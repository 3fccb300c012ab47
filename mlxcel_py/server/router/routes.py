"""The router's HTTP side, in llama-server's router API:

- `GET /models`, `/v1/models`: every model of the folder with its `status` (`unloaded`, `loading`,
  `loaded`; a failed start says `failed` and its `exit_code`) and its `path`;
- `POST /models/load`, `/models/unload` with `{"model"}`: `{"success": true}` (a load answers once
  the process starts; `GET /models` says when it is loaded);
- `GET /props`: the router's own (`role: "router"`, `max_instances`, `models_autoload`), or a
  model's with `?model=ID`; `GET /health`;
- everything else goes to the model the request names, loaded first where autoload allows: a
  POST by its JSON body's `model`, a GET by `?model=ID`; `?autoload=true|false` overrides
  `--no-models-autoload` for one request. The answer streams back as the model's server sends it.

Access (keys, Host, CORS) is checked here, as on one model's server; the model's own server is
reached with the key the router gave it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from .. import webui as webui_routes
from ..app import install_error_handlers
from ..http import BODY_LIMIT, HOP_BY_HOP, ApiError, Cors, Guard, parse_json, read_body, read_json, relay
from ..security import AccessPolicy, CorsPolicy
from ..stream_sessions import HEADER, MAX_SESSIONS
from ..tools import routes as tools_routes
from ..webui import BUILD_INFO, CSP, page, wants_json
from .catalog import Preset
from .instances import Instances

NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "authorization", "x-api-key"}
NOT_RETURNED = HOP_BY_HOP | {"content-length"}


def create_router_app(
    instances: Instances,
    *,
    access: AccessPolicy = AccessPolicy(),
    cors: CorsPolicy = CorsPolicy(),
    body_limit: int = BODY_LIMIT,
    access_log: bool = False,
    reload: Callable[[], tuple[list, Preset]] | None = None,
    webui: bool = True,
    cache: Path | None = None,
) -> FastAPI:
    """`reload`: the folder, preset and cache read again, for GET /models?reload=1 (and after a
    download or a removal); `cache`: the Hugging Face cache POST and DELETE /models work in."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        for model_id in sorted(instances.preset.startup & set(instances.by_id)):  # a preset's load-on-startup
            await instances.load(model_id)  # starts it; the server answers while it loads
        yield

    app = FastAPI(title="mlxcel-py router", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.instances = instances
    app.state.webui, app.state.body_limit = webui, body_limit
    app.state.tools = None  # --tools: a tools.ServerTools (router/main.py sets it)
    created = int(time.time())
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/")
    async def root(request: Request):
        """The chat page, with a picker of the router's models (JSON clients get health)."""
        if wants_json(request.headers.get("accept", "")):
            return {"status": "ok"}
        if not webui:
            raise ApiError("the chat page is off (--no-webui)", status=404, type="not_found_error")
        return HTMLResponse(page(), headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})

    # the page's files, as a model's server serves them (webui.py); /tools is served here, where the page is
    for path in ("/bundle.js", "/bundle.css", "/sw.js", "/manifest.webmanifest"):
        app.add_api_route(path, webui_routes.asset, methods=["GET"])
    app.add_api_route("/_app/version.json", webui_routes.version, methods=["GET"])
    app.include_router(tools_routes.router)

    async def read_again() -> None:
        if reload is not None:
            await instances.reconcile(*await asyncio.get_running_loop().run_in_executor(None, reload))

    @app.get("/models")
    @app.get("/v1/models")
    async def models(request: Request):
        if request.query_params.get("reload") in ("1", "true"):
            await read_again()
        asleep = await _asleep(list(instances.by_id.values()))
        data = []
        for i in [i for i in instances.by_id.values() if i.entry.listed]:
            status = i.describe()
            if i.entry.id in asleep:
                status["value"] = "sleeping"
            data.append(
                {
                    "id": i.entry.id,
                    "object": "model",
                    "owned_by": "mlxcel-py",
                    "created": created,
                    "path": str(i.entry.path),
                    "status": status,
                    "source": i.entry.source,
                    "can_remove": i.entry.source == "cache",
                }
            )
        for spec, job in list(instances.downloads.items()):
            status = {"value": "downloading", "progress": dict(job.progress)}
            data.append(
                {"id": spec, "object": "model", "owned_by": "mlxcel-py", "created": created, "status": status}
                | {"source": "cache", "can_remove": True}
            )
        return {"object": "list", "data": data}

    @app.post("/models")
    async def download(request: Request):
        """llama-server's download into the Hugging Face cache: checked on the hub before the
        answer, then fetched in the background (/models/sse: download_progress, download_finished)."""
        from ...models.hub_cache import split_spec

        spec = (await read_json(request, body_limit)).get("model")
        if not isinstance(spec, str) or not spec:
            raise ApiError("model must be a non-empty string (OWNER/NAME[:QUANT])")
        try:
            split_spec(spec)
        except ValueError as exc:
            raise ApiError(str(exc)) from None
        await instances.download(spec, read_again)
        return {"success": True}

    @app.delete("/models")
    async def remove(request: Request):
        """A cache model's files deleted (stopped first), or its download cancelled."""
        model = request.query_params.get("model")
        if not model:
            raise ApiError("model must be a non-empty string: DELETE /models?model=ID")
        await instances.remove(model, cache, read_again)
        return {"success": True}

    @app.get("/models/sse")
    async def events(request: Request):
        """llama-server's model events, as server-sent events, until the client leaves."""
        q: asyncio.Queue = asyncio.Queue()
        instances.listeners.append(q)

        async def stream():
            try:
                while not await request.is_disconnected():
                    try:
                        item = await asyncio.wait_for(q.get(), 15.0)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    yield f"data: {json.dumps(item)}\n\n".encode()
            finally:
                instances.listeners.remove(q)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _asleep(candidates) -> set[str]:
        """The loaded models whose server sleeps (--sleep-idle-seconds), asked at once."""
        loaded = [i for i in candidates if i.status == "loaded" and i.port is not None]
        if not loaded:
            return set()
        client = _client(app)

        async def one(i) -> bool:
            try:
                r = await client.get(
                    f"http://127.0.0.1:{i.port}/props", headers={"Authorization": f"Bearer {i.key}"}, timeout=1.0
                )
                return bool(r.json().get("is_sleeping"))
            except Exception:  # busy, starting or gone: not known to sleep
                return False

        answers = await asyncio.gather(*(one(i) for i in loaded))
        return {i.entry.id for i, a in zip(loaded, answers) if a}

    @app.post("/models/load")
    async def load(request: Request):
        body = await read_json(request, body_limit)
        await instances.load(body.get("model"))
        return {"success": True}

    @app.post("/models/unload")
    async def unload(request: Request):
        body = await read_json(request, body_limit)
        await instances.unload(body.get("model"))
        return {"success": True}

    @app.get("/props")
    async def props(request: Request):
        if "model" in request.query_params:
            return await _proxy(request, request.query_params["model"], b"")
        return {
            "role": "router",
            "max_instances": instances.max_instances,
            "models_autoload": instances.autoload,
            "build_info": BUILD_INFO,
        }

    # resumable streams (a model's stream_sessions): which model holds each conversation's session,
    # noted as its POST passes (a ticket per POST, so a Stop during the model's load cancels it)
    owners: dict[str, tuple[str, int]] = {}
    tickets = iter(range(1, 1 << 62))

    def _owner(request: Request) -> tuple[str, object]:
        conv_id = request.query_params.get("conv_id", "")
        if not conv_id:
            raise ApiError("Missing conversation id in path")
        model = owners.get(conv_id, ("", 0))[0]
        return conv_id, instances.by_id.get(model)

    @app.get("/v1/stream")
    async def read_stream(request: Request):
        _, inst = _owner(request)
        if inst is not None and inst.status == "loading":
            raise ApiError("Stream owner model is loading, retry later", status=503, type="unavailable_error")
        if inst is None or inst.status != "loaded":
            raise ApiError("Stream not found or expired", status=404, type="not_found_error")
        return await _proxy(request, inst.entry.id, b"", autoload=False)

    @app.delete("/v1/stream")
    async def stop_stream(request: Request):
        conv_id, inst = _owner(request)
        owners.pop(conv_id, None)  # a POST still waiting for its model's load sees this and stops
        if inst is not None and inst.status == "loaded":
            return await _proxy(request, inst.entry.id, b"", autoload=False)
        return Response(status_code=204)

    @app.post("/v1/streams/lookup")
    async def lookup_streams(request: Request):
        """Every loaded model's sessions of those ids."""
        body = await read_body(request, body_limit)
        parse_json(body)
        found: list = []
        for inst in [i for i in instances.by_id.values() if i.status == "loaded"]:
            try:
                r = await _client(app).post(
                    f"http://127.0.0.1:{inst.port}/v1/streams/lookup",
                    content=body,
                    headers={"Authorization": f"Bearer {inst.key}", "Content-Type": "application/json"},
                    timeout=5.0,
                )
                sessions = r.json() if r.status_code == 200 else []
                found += sessions if isinstance(sessions, list) else []
            except Exception:  # noqa: BLE001 - a model busy or gone has nothing to add
                pass
        return found

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def forward(request: Request, path: str):
        if request.method == "GET" or request.method == "DELETE":
            model = request.query_params.get("model")
            if model is None:
                raise ApiError(f"name the model of GET /{path[:100]} with ?model=ID (GET /models lists them)")
            return await _proxy(request, model, b"")
        body = await read_body(request, body_limit)
        parsed = parse_json(body)  # strictly, as a model's server reads it: a bad body is the router's 400
        return await _proxy(request, parsed.get("model"), body, conv_id=request.headers.get(HEADER, ""))

    async def _proxy(request: Request, model, body: bytes, *, autoload: bool | None = None, conv_id: str = ""):
        autoload = _autoload(request.query_params.get("autoload")) if autoload is None else autoload
        ticket = 0
        if conv_id and isinstance(model, str) and model in instances.by_id:
            ticket = next(tickets)
            owners.pop(conv_id, None)
            owners[conv_id] = (model, ticket)
            while len(owners) > MAX_SESSIONS:  # the oldest conversations' go first, as their sessions do
                owners.pop(next(iter(owners)))
        # a resumable request goes on when its client leaves during the load (a page reload): its
        # model's session gets the generation for the client's next GET /v1/stream
        gone = None if ticket else request.is_disconnected
        inst = await instances.acquire(model, autoload, gone=gone)
        if ticket and owners.get(conv_id, ("", 0))[1] != ticket:
            instances.release(inst)
            raise ApiError("request cancelled by a stop while the model was loading")
        try:
            return await _send(request, inst, body)
        except BaseException:
            instances.release(inst)
            raise

    async def _send(request: Request, inst, body: bytes):
        """The request to the model's server; the model is released when the answer has been
        relayed (or the client left)."""
        import httpx

        client = _client(app)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
        headers["Authorization"] = f"Bearer {inst.key}"
        url = f"http://127.0.0.1:{inst.port}{request.url.path}"
        if request.url.query:
            url += f"?{request.url.query}"
        try:
            upstream = await client.send(
                client.build_request(request.method, url, headers=headers, content=body), stream=True
            )
        except httpx.HTTPError as exc:
            raise ApiError(
                f"model {inst.entry.id} did not answer ({type(exc).__name__})", status=502, type="unavailable_error"
            ) from None
        returned = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RETURNED}

        async def release() -> None:  # once the answer has been relayed, or its client has left
            instances.release(inst)

        return await relay(upstream, returned, release)

    app.add_middleware(Guard, access=access, body_limit=body_limit, access_log=access_log, cors=cors)
    app.add_middleware(Cors, policy=cors)
    return app


def _client(app: FastAPI):
    import httpx

    client = getattr(app.state, "client", None)
    if client is None:
        # no timeout on reading: a long generation streams for as long as it decodes
        client = httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=httpx.Timeout(None, connect=10.0))
        app.state.client = client
    return client


def _autoload(value: str | None) -> bool | None:
    if value is None:
        return None
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise ApiError(f"'autoload' must be true or false, got {value[:20]!r}")

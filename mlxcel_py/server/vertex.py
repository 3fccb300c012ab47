"""Google Cloud Vertex AI's custom-container prediction protocol, as llama-server speaks it when
started with `AIP_MODE=PREDICTION` in its environment (what Vertex AI sets for a container).

Vertex AI sends `POST AIP_PREDICT_ROUTE` (default `/predict`) with `{"instances": [...]}` to the
port in `AIP_HTTP_PORT` (which then replaces --port), and checks `AIP_HEALTH_ROUTE` (an alias of
/health when set). Each instance names the route it is for in `@requestFormat`: a route's path
(`/v1/chat/completions`) or llama-server's camelCase alias of it (`chatCompletions`: `/v1`
dropped, `/`, `-` and `_` starting a capital). The rest of the instance is that route's body,
never streamed. The instances run side by side through this same app (its key check, limits and
errors included), and the reply is `{"predictions": [...]}`: each route's JSON, an error body
included, in the instances' order. More than MAX_INSTANCES is a 400, as llama-server's limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import MlxcelError
from .http import ApiError, error_body, parse_json, read_body

MAX_INSTANCES = 128
FORWARDED = ("authorization", "x-api-key", "api-key", "origin", "user-agent")  # what the inner request keeps


@dataclass(frozen=True)
class Prediction:
    """The protocol's settings from the environment Vertex AI gives a container."""

    predict_route: str = "/predict"
    health_route: str | None = None
    port: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Prediction | None:
        """None unless AIP_MODE is PREDICTION."""
        if env.get("AIP_MODE") != "PREDICTION":
            return None
        port = env.get("AIP_HTTP_PORT") or ""
        return cls(
            _route(env.get("AIP_PREDICT_ROUTE")) or "/predict",
            _route(env.get("AIP_HEALTH_ROUTE")),
            int(port) if port.isdigit() else None,
        )


def _route(value: str | None) -> str | None:
    return None if not value else value if value.startswith("/") else "/" + value


def alias(path: str) -> str:
    """llama-server's camelCase @requestFormat for a route's path."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s.lstrip("/")
    out, cap = [], False
    for c in s:
        if c in "{:":  # path parameters end the name
            break
        if c in "/-_":
            cap = True
            continue
        out.append(c.upper() if cap else c)
        cap = False
    return "".join(out)


def install(app: FastAPI, settings: Prediction) -> None:
    """Add the predict route (and the health alias) to `app`, whose routes are all registered."""
    posts = [p for p in _paths(app.routes, "POST") if "{" not in p]
    if settings.predict_route in posts:
        raise MlxcelError(
            f"AIP_PREDICT_ROUTE={settings.predict_route} is one of this server's own routes", hint="name another"
        )
    targets: dict[str, str] = {}
    for path in posts:
        targets.setdefault(alias(path), path)  # the first registered wins, as llama-server's
    targets.update({p: p for p in posts})

    async def predict(request: Request):
        body = parse_json(await read_body(request, request.app.state.body_limit))
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise ApiError("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise ApiError(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        import httpx

        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        transport = httpx.ASGITransport(app=request.app, client=("127.0.0.1", 0))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=None) as client:
            predictions = await asyncio.gather(*(_one(client, targets, i, headers) for i in instances))
        return JSONResponse({"predictions": predictions})

    app.add_api_route(settings.predict_route, predict, methods=["POST"])
    if settings.health_route:
        health = _endpoint(app.routes, "/health")
        app.add_api_route(settings.health_route, health, methods=["GET"])


def _routes(routes: list) -> list:
    """Every route, through the routers included (FastAPI keeps an included router whole)."""
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        out += _routes(inner.routes) if inner is not None else [r]
    return out


def _paths(routes: list, method: str) -> list[str]:
    return [r.path for r in _routes(routes) if method in (getattr(r, "methods", None) or ())]


def _endpoint(routes: list, path: str) -> Any:
    return next(r.endpoint for r in _routes(routes) if getattr(r, "path", None) == path)


async def _one(client: Any, targets: dict[str, str], instance: Any, headers: dict) -> Any:
    """One instance through the route it names (`client`: this app's own, in process): that
    route's JSON (an error body included)."""
    if not isinstance(instance, dict):
        return error_body("each instance must be a JSON object", "invalid_request_error", 400)
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return error_body("each instance must include a string @requestFormat", "invalid_request_error", 400)
    path = targets.get(fmt)
    if path is None:
        return error_body(f"no handler registered for @requestFormat: {fmt[:100]}", "invalid_request_error", 400)
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False  # the predict route answers whole
    r = await client.post(path, content=json.dumps(payload), headers={**headers, "content-type": "application/json"})
    try:
        return r.json()
    except ValueError:
        return r.text

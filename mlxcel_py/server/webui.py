"""The chat page at `/` (`--no-webui` turns it off) and llama-server's `/props`, which it reads.

`/` gives the page to every client, as llama-server does (under --no-webui a 404, as its), except
one that asks for JSON (Accept names application/json and not text/html): that one gets the health
JSON, so a probe can still read health at `/`. llama.cpp's own suite reads the page with
`requests.get(url)` (Accept: */*) and expects the 404 the same way. The page is three files
shipped in the package, served at llama-server's paths (`/`, `/bundle.js`, `/bundle.css`) without
the API key as its static assets are (webui/: no CDN, no network); it talks to the
OpenAI chat route like any client, with the key the user typed (kept in the browser).
`/props` follows llama-server's shape (default_generation_settings, total_slots, model_alias,
n_ctx) plus `speculative`: whether this server drafts, with which drafter, and the request
field that turns drafting off for one request (`speculative.n_max: 0`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from .. import __version__
from .context import ctx_of
from .responses import RANDOM_SEED
from .routes_native import health

# llama-server's `b<build>-<commit>`: the llama-server build whose API this mirrors, then this
# package's version (clients read the `b` number; llama.cpp's suite checks the form)
BUILD_INFO = f"b10621-mlxcel-py-{__version__}"

router = APIRouter()
WEBUI = Path(__file__).with_name("webui")
PAGE = WEBUI / "index.html"
# the page's own script and style come from this server; nothing else may load (inline style
# attributes aside)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:"
)


@functools.cache
def page(name: str = "index.html") -> str:
    return (WEBUI / name).read_text(encoding="utf-8")


def _off(request: Request) -> JSONResponse | None:
    if getattr(request.app.state, "webui", False):
        return None
    return JSONResponse(  # --no-webui: no page, as llama-server's
        {"error": {"code": 404, "message": "the chat page is off (--no-webui)", "type": "not_found_error"}},
        status_code=404,
    )


def wants_json(accept: str) -> bool:
    accept = accept.lower()
    return "application/json" in accept and "text/html" not in accept


@router.get("/")
async def root(request: Request):
    if wants_json(request.headers.get("accept", "")):
        return await health(request)
    off = _off(request)
    if off is not None:
        return off
    return HTMLResponse(page(), headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})


KINDS = {".js": "text/javascript", ".css": "text/css", ".webmanifest": "application/manifest+json"}


@router.get("/bundle.js")
@router.get("/bundle.css")
@router.get("/sw.js")
@router.get("/manifest.webmanifest")
async def asset(request: Request):
    """The page's files at llama-server's asset paths, public as its are: script, style, the web
    app manifest, and at /sw.js a worker that removes the one llama-server's page registers
    there (webui/sw.js says why)."""
    off = _off(request)
    if off is not None:
        return off
    name = request.url.path.lstrip("/")
    kind = KINDS[Path(name).suffix]
    return Response(page(name), media_type=f"{kind}; charset=utf-8", headers={"Cache-Control": "no-cache"})


@router.get("/_app/version.json")
async def version(request: Request):
    """The version file llama-server's page polls to notice a new build: this server's version."""
    off = _off(request)
    return off if off is not None else JSONResponse({"version": __version__}, headers={"Cache-Control": "no-cache"})


@router.get("/props")
async def props(request: Request):
    ctx = ctx_of(request)
    d = ctx.defaults
    draft = ctx.engine.draft
    drafting = bool(draft.enabled and ctx.worker.speculative_allowed)
    return {
        "default_generation_settings": {
            "n_ctx": ctx.engine.context_length,
            "params": {
                "temperature": d.temp,
                "top_p": d.top_p,
                "top_k": d.top_k,
                "min_p": d.min_p,
                "repeat_penalty": d.repetition_penalty,
                "n_predict": ctx.max_tokens,
                "seed": RANDOM_SEED if d.seed is None else d.seed,
            },
        },
        "total_slots": ctx.worker.parallel,
        "model_alias": ctx.model_id,
        "model_path": ctx.model_path,
        "build_info": BUILD_INFO,
        "modalities": {"vision": ctx.vision is not None, "audio": False},  # llama-server's (the page reads it)
        "is_sleeping": ctx.worker.asleep,  # --sleep-idle-seconds: the model is released until a request
        "speculative": {
            "enabled": drafting,
            "kind": draft.kind if drafting else None,
            "plain_request_field": "speculative.n_max",
        },
    }

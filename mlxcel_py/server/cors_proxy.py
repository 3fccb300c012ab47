"""llama-server's MCP CORS proxy (`--ui-mcp-proxy`, formerly `--webui-mcp-proxy`):
`/cors-proxy?url=URL` forwards the request (method, body, headers) to URL and streams its answer
back, so a web page can reach an MCP server that sends no CORS headers. Off by default (403).

A proxy on a machine's loopback reaches what a web page must not, so a target is refused (400)
unless it is a public address (server/addresses.py: the policy, shared with --image-url-fetch);
`--ui-mcp-proxy-allow HOST` lets exact hosts through. The connection goes to the address checked.
Redirects are handed back, never followed. The target gets only the headers a client names as
`x-llama-server-proxy-header-NAME` (and the body's Content-Type), as llama-server's proxy. This server's own API key
and cookies are not forwarded to the target.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, Request

from .addresses import Policy, Target, address_of, parse
from .http import HOP_BY_HOP, ApiError, read_body, relay

router = APIRouter()
EXPLICIT = "x-llama-server-proxy-header-"  # a header the client asks the proxy to send on
# headers never sent on, even named explicitly: the connection's own and what the proxy sets
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
# response headers not handed back: this server sets its own CORS and length, and no cookies
NOT_RETURNED = HOP_BY_HOP | {"content-length", "set-cookie"}
CONNECT_SECONDS, READ_SECONDS = 10.0, 600.0  # an MCP server's event stream may stay open for long


def forwarded_headers(headers: Iterable[tuple[str, str]], own_keys: Iterable[str]) -> dict[str, str]:
    """The headers the target gets, as llama-server chooses them: only those the client names
    explicitly, `x-llama-server-proxy-header-NAME: VALUE` as `NAME: VALUE` (how llama.cpp's web UI
    sends an MCP server its own Authorization), and the body's Content-Type. Nothing else the
    client sent (this server's key, cookies, Proxy-Authorization) goes on, no hop-by-hop header,
    and never this server's own API key, even named explicitly."""
    keys = set(own_keys)
    out: dict[str, str] = {}
    for name, value in headers:
        low = name.lower()
        if low == "content-type":
            out.setdefault("Content-Type", value)
            continue
        if not low.startswith(EXPLICIT) or not (named := name[len(EXPLICIT) :]) or named.lower() in NOT_FORWARDED:
            continue
        scheme, _, token = value.partition(" ")
        if named.lower() == "authorization" and scheme.lower() == "bearer" and token.strip() in keys:
            continue
        if named.lower() == "x-api-key" and value.strip() in keys:
            continue
        out = {k: v for k, v in out.items() if k.lower() != named.lower()}  # an explicit one wins
        out[named] = value
    return out


@router.api_route("/cors-proxy", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def cors_proxy(request: Request):
    state = request.app.state
    if not getattr(state, "mcp_proxy", False):
        raise ApiError(
            "the MCP CORS proxy is off; start the server with --ui-mcp-proxy to turn it on",
            status=403,
            type="forbidden_error",
        )
    policy = Policy.of(getattr(state, "mcp_proxy_allow", ()))
    target = parse(request.query_params.get("url", ""), policy)
    address = await address_of(target, policy)
    body = await read_body(request, state.body_limit)
    headers = forwarded_headers(request.headers.items(), getattr(state, "api_keys", ()))
    headers["Host"] = target.authority
    return await _send(request, target, address, headers, body)


async def _send(request: Request, target: Target, address: str, headers: dict, body: bytes):
    import httpx

    url = target.url_at(address)
    client = httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,  # no proxy from the environment: the address checked is the one reached
        timeout=httpx.Timeout(READ_SECONDS, connect=CONNECT_SECONDS),
    )
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    try:
        upstream = await client.send(
            client.build_request(request.method, url, headers=headers, content=body, extensions=extensions),
            stream=True,
        )
    except httpx.TimeoutException:
        await client.aclose()
        raise ApiError(f"the proxy's target {target.authority} did not answer in time", status=504) from None
    except httpx.HTTPError as exc:
        await client.aclose()
        raise ApiError(f"the proxy cannot reach {target.authority}: {type(exc).__name__}", status=502) from None
    returned = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() not in NOT_RETURNED and not k.lower().startswith("access-control-")
    }
    return await relay(upstream, returned, client.aclose)

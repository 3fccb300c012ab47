"""llama-server's MCP CORS proxy (`--ui-mcp-proxy`, formerly `--webui-mcp-proxy`):
`/cors-proxy?url=URL` forwards the request (method, body, headers) to URL and streams its answer
back, so a web page can reach an MCP server that sends no CORS headers. Off by default (403).

A proxy on a machine's loopback reaches what a web page must not, so a target is refused (400)
unless it is a public address: URLs with credentials, other schemes or malformed authorities,
loopback, private, link-local, shared, reserved and multicast addresses (IPv4-mapped IPv6 too),
and cloud metadata names. `--ui-mcp-proxy-allow HOST` lets exact hosts through (case and a
trailing dot aside; an allowed name does not allow its neighbours, and the rest of the policy
stays). A name is resolved first and every address it gives is checked; the connection then goes
to the address checked (the Host header and TLS name stay the URL's), so a second lookup cannot
swap in a private address. Redirects are handed back, never followed. This server's own API key
and cookies are not forwarded to the target.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from fastapi import APIRouter, Request

from .http import HOP_BY_HOP, ApiError, read_body, relay

router = APIRouter()
METADATA_NAMES = ("metadata.google.internal", "metadata.goog")
# request headers kept from the target: where the request came from and what identifies it here
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "origin", "referer", "cookie", "accept-encoding"}
# response headers not handed back: this server sets its own CORS and length, and no cookies
NOT_RETURNED = HOP_BY_HOP | {"content-length", "set-cookie"}
CONNECT_SECONDS, READ_SECONDS = 10.0, 600.0  # an MCP server's event stream may stay open for long
_URL = re.compile(r"^(https?)://([^/?#]*)(/[^#]*)?$", re.IGNORECASE)
_IPV6 = re.compile(r"^\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?$")
_NAME = re.compile(r"^([A-Za-z0-9.-]+)(?::(\d{1,5}))?$")


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as the URL spells it (no brackets), lowercased, without a trailing dot
    port: int
    path: str  # path and query, "/" at least

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def normalized(host: str) -> str:
    return host.strip().lower().rstrip(".")


def parse(url: str) -> Target:
    """The target of `url`, or a 400 naming what is wrong with it."""
    m = _URL.match(url or "")
    if m is None:
        raise ApiError("the proxy's url must be an http:// or https:// URL (scheme, host, then a path)")
    scheme, authority, path = m.group(1).lower(), m.group(2), m.group(3) or "/"
    if "@" in authority:
        raise ApiError("the proxy's url must not carry credentials (user@ or user:password@)")
    hm = _IPV6.match(authority) or _NAME.match(authority)
    if hm is None or not hm.group(1):
        raise ApiError(f"the proxy's url has a malformed host: {authority[:100]!r}")
    port = int(hm.group(2)) if hm.group(2) else (443 if scheme == "https" else 80)
    if not 1 <= port <= 65535:
        raise ApiError(f"the proxy's url has a port out of range: {port}")
    host = normalized(hm.group(1))
    if authority.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ApiError(f"the proxy's url has a malformed IPv6 host: {authority[:100]!r}") from None
    return Target(scheme, host, port, path)


def public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def address_of(target: Target, allowed: Iterable[str]) -> str:
    """The address to connect to, once the policy lets `target` through (else a 400, or a 502
    when its name does not resolve)."""
    allow = target.host in {normalized(a) for a in allowed}
    ip = literal(target.host)
    if ip is not None:
        if not allow and not public(ip):
            raise ApiError(f"the proxy does not reach {target.host}: not a public address (--ui-mcp-proxy-allow)")
        return str(ip)
    if not allow and (target.host in METADATA_NAMES or target.host.endswith(".internal") or "." not in target.host):
        raise ApiError(f"the proxy does not reach {target.host}: not a public name (--ui-mcp-proxy-allow)")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ApiError(f"the proxy cannot resolve {target.host}: {exc.strerror or exc}", status=502) from None
    addresses = [str(info[4][0]).split("%")[0] for info in infos]
    if not addresses:
        raise ApiError(f"the proxy cannot resolve {target.host}", status=502)
    if not allow:
        for a in addresses:
            ip = literal(a)
            if ip is None or not public(ip):
                raise ApiError(
                    f"the proxy does not reach {target.host}: it resolves to {a}, not a public address "
                    "(--ui-mcp-proxy-allow)"
                )
    return addresses[0]


def forwarded_headers(headers: Iterable[tuple[str, str]], own_keys: Iterable[str]) -> dict[str, str]:
    """The request's headers as the target gets them: no hop-by-hop ones, nothing naming this
    server or its client's session here, and never this server's own API key."""
    keys = set(own_keys)
    out: dict[str, str] = {}
    for name, value in headers:
        low = name.lower()
        if low in NOT_FORWARDED:
            continue
        scheme, _, token = value.partition(" ")
        if low == "authorization" and scheme.lower() == "bearer" and token.strip() in keys:
            continue
        if low == "x-api-key" and value.strip() in keys:
            continue
        out[name] = value
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
    target = parse(request.query_params.get("url", ""))
    address = await address_of(target, getattr(state, "mcp_proxy_allow", ()))
    body = await read_body(request, state.body_limit)
    headers = forwarded_headers(request.headers.items(), getattr(state, "api_keys", ()))
    headers["Host"] = target.authority
    return await _send(request, target, address, headers, body)


async def _send(request: Request, target: Target, address: str, headers: dict, body: bytes):
    import httpx

    host = f"[{address}]" if ":" in address else address
    url = f"{target.scheme}://{host}:{target.port}{target.path}"
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

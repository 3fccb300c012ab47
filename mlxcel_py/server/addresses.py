"""Where the server may connect on a request's behalf: the MCP CORS proxy (`--ui-mcp-proxy`) and
remote images (`--image-url-fetch`). A request names a URL; without a policy it could make this
machine reach what the client cannot (its loopback services, the LAN, a cloud's metadata
address): server-side request forgery.

The policy: an http(s) URL without credentials, whose host is a public address, or a name every
address of which is public (loopback, private, link-local, shared, reserved and multicast
addresses are not, IPv4-mapped IPv6 included, nor cloud metadata names, `.internal` names or
single-label names). An allow list (the flag each user names) lets exact hosts through, case and a
trailing dot aside; it does not allow a name's neighbours. The caller connects to the address
checked here, never to the name again (the Host header and TLS name stay the URL's), so a second
lookup cannot swap in a private address; a redirect is a new URL, checked again or not followed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from .http import ApiError

METADATA_NAMES = ("metadata.google.internal", "metadata.goog")
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

    def url_at(self, address: str) -> str:
        """The URL with its host replaced by `address` (the one the policy checked)."""
        host = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{host}:{self.port}{self.path}"


@dataclass(frozen=True)
class Policy:
    """Who is asking (for messages) and the hosts its flag lets through."""

    who: str = "the proxy"  # "the proxy does not reach ..."
    url: str = "the proxy's url"  # "the proxy's url must be ..."
    flag: str = "--ui-mcp-proxy-allow"
    allowed: frozenset[str] = frozenset()

    @classmethod
    def of(cls, allowed: Iterable[str], **kw) -> Policy:
        return cls(allowed=frozenset(normalized(a) for a in allowed), **kw)


def normalized(host: str) -> str:
    return host.strip().lower().rstrip(".")


def parse(url: str, policy: Policy = Policy()) -> Target:
    """The target of `url`, or a 400 naming what is wrong with it."""
    m = _URL.match(url or "")
    if m is None:
        raise ApiError(f"{policy.url} must be an http:// or https:// URL (scheme, host, then a path)")
    scheme, authority, path = m.group(1).lower(), m.group(2), m.group(3) or "/"
    if "@" in authority:
        raise ApiError(f"{policy.url} must not carry credentials (user@ or user:password@)")
    hm = _IPV6.match(authority) or _NAME.match(authority)
    if hm is None or not hm.group(1):
        raise ApiError(f"{policy.url} has a malformed host: {authority[:100]!r}")
    port = int(hm.group(2)) if hm.group(2) else (443 if scheme == "https" else 80)
    if not 1 <= port <= 65535:
        raise ApiError(f"{policy.url} has a port out of range: {port}")
    host = normalized(hm.group(1))
    if authority.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ApiError(f"{policy.url} has a malformed IPv6 host: {authority[:100]!r}") from None
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


def _before_lookup(target: Target, policy: Policy) -> str | None:
    """The address of a literal host once allowed (None: a name, to be resolved)."""
    allow = target.host in policy.allowed
    ip = literal(target.host)
    if ip is not None:
        if not allow and not public(ip):
            raise ApiError(f"{policy.who} does not reach {target.host}: not a public address ({policy.flag})")
        return str(ip)
    if not allow and (target.host in METADATA_NAMES or target.host.endswith(".internal") or "." not in target.host):
        raise ApiError(f"{policy.who} does not reach {target.host}: not a public name ({policy.flag})")
    return None


def _after_lookup(target: Target, infos: list, policy: Policy) -> str:
    addresses = [str(info[4][0]).split("%")[0] for info in infos]
    if not addresses:
        raise ApiError(f"{policy.who} cannot resolve {target.host}", status=502)
    if target.host not in policy.allowed:
        for a in addresses:
            ip = literal(a)
            if ip is None or not public(ip):
                raise ApiError(
                    f"{policy.who} does not reach {target.host}: it resolves to {a}, not a public address "
                    f"({policy.flag})"
                )
    return addresses[0]


async def address_of(target: Target, policy: Policy) -> str:
    """The address to connect to, once the policy lets `target` through (else a 400, or a 502
    when its name does not resolve)."""
    if (address := _before_lookup(target, policy)) is not None:
        return address
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ApiError(f"{policy.who} cannot resolve {target.host}: {exc.strerror or exc}", status=502) from None
    return _after_lookup(target, infos, policy)


def address_of_now(target: Target, policy: Policy) -> str:
    """`address_of` for a caller off the event loop (a route's worker thread)."""
    if (address := _before_lookup(target, policy)) is not None:
        return address
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ApiError(f"{policy.who} cannot resolve {target.host}: {exc.strerror or exc}", status=502) from None
    return _after_lookup(target, infos, policy)

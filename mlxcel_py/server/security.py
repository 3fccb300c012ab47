"""Who may talk to the server: API keys, the Host header on loopback binds, JSON-only POSTs.

- Keys (`--api-key`, repeatable or comma-separated, and `--api-key-file`, one per line) are
  compared in constant time; `Authorization: Bearer KEY` (scheme in any case) or `X-Api-Key: KEY`.
  `/health`, `/models`, `/v1/models` and the chat page (`/`, `/bundle.js`, `/bundle.css`) stay
  public, as in llama-server. A refusal is llama-server's
  401 (`type: "authentication_error"`).
- A server bound to loopback answers only requests whose Host names loopback: a web page on some
  other site cannot reach it through DNS rebinding (its Host would be that site's name).
- CORS with llama-server's flags (`--cors-origins/-methods/-headers`, `--[no-]cors-credentials`)
  but Ollama's default: only pages served from this machine (`localhost`: any loopback origin on
  any port) and the server's own chat page (an Origin naming the Host the request came to) may
  call it. llama-server reflects every origin with credentials, so any web page the user visits
  could drive a keyless server and read its replies; `--cors-origins '*'` restores that (with a
  startup warning when no key is set), a list names origins, an empty list allows none.
  Preflights are answered before the key check; an origin not allowed gets its 200 without
  `Access-Control-Allow-Origin`, so the browser refuses the call, not the server.
- A request whose Origin is not allowed is refused (403) unless its method is GET or HEAD, whatever
  its content type: a cross-site "simple" POST (a form, text/plain), which a browser sends without
  asking first, never reaches the model. Clients that send no Origin (curl, SDKs) are not browsers:
  their bodies are read as JSON whatever their content type (plain `curl -d`), as llama-server does.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import UsageError
from ..inputs.files import MIB, UnreadableFile, read_text

# the chat page's static files (llama-server's paths: its UI's worker, manifest and version file too)
WEBUI_FILES = frozenset({"/", "/bundle.js", "/bundle.css", "/sw.js", "/manifest.webmanifest", "/_app/version.json"})
PUBLIC_PATHS = WEBUI_FILES | {"/health", "/models", "/v1/models"}
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def parse_keys(values: tuple[str, ...] | list[str] | None, key_file: str | None) -> tuple[str, ...]:
    """Keys from repeated/comma-separated flags and a file (blank lines and '#' lines skipped)."""
    keys = [k.strip() for v in values or () for k in v.split(",") if k.strip()]
    if key_file:
        try:
            text = read_text(key_file, MIB)
        except UnreadableFile as exc:
            raise UsageError(f"--api-key-file {key_file}: {exc}") from None
        keys += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not keys:
            raise UsageError(f"--api-key-file {key_file}: no key in it (one key per line)")
    return tuple(dict.fromkeys(keys))


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class AccessPolicy:
    api_keys: tuple[str, ...] = ()
    loopback_only_hosts: bool = False  # bound to loopback: the Host header must name loopback

    def authorized(self, path: str, headers) -> bool:
        if not self.api_keys or path in PUBLIC_PATHS:
            return True
        # either header may carry the key; an empty one (a client's unset variable) is no key,
        # and does not hide the other
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = [
            g for g in (headers.get("x-api-key", "").strip(), token.strip() if scheme.lower() == "bearer" else "") if g
        ]
        # compare with every key (no early exit), each in constant time
        matches = [hmac.compare_digest(g.encode(), k.encode()) for g in given for k in self.api_keys]
        return any(matches)

    def host_allowed(self, host_header: str | None) -> bool:
        if not self.loopback_only_hosts:
            return True
        if not host_header:
            return False
        host = host_header.strip()
        if host.startswith("["):  # [::1]:8080
            name = host[: host.find("]") + 1] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return is_loopback(name.lower())


CORS_ANY, CORS_LOOPBACK = "*", "localhost"


@dataclass(frozen=True)
class CorsPolicy:
    """Which browser origins may call the server, and what a preflight answers them."""

    origins: tuple[str, ...] = (CORS_LOOPBACK,)  # Ollama's default; llama-server's is ("*",)
    methods: str = "GET, POST, DELETE, OPTIONS"  # llama-server's (its test_security.py)
    headers: str = "*"
    credentials: bool = True

    @classmethod
    def parse(cls, origins: str | None, methods: str | None, headers: str | None, credentials: bool) -> CorsPolicy:
        """From the flags: None keeps a default; an empty `--cors-origins` (or `none`) allows no origin."""
        listed = cls.origins if origins is None else tuple(o.strip() for o in origins.split(",") if o.strip())
        if listed == ("none",):
            listed = ()
        for o in listed:
            if o not in (CORS_ANY, CORS_LOOPBACK) and any(c.isspace() for c in o):
                raise UsageError(f"--cors-origins: '{o}' is not an origin (like https://app.example or localhost)")
        return cls(
            listed,
            ", ".join(m.strip().upper() for m in (methods or cls.methods).split(",") if m.strip()),
            ", ".join(h.strip() for h in (headers or cls.headers).split(",") if h.strip()),
            credentials,
        )

    @property
    def relaxed(self) -> bool:
        return CORS_ANY in self.origins

    def allows(self, origin: str | None, host: str | None = None) -> bool:
        """Whether a page on `origin` may call the server; `host` (the request's Host header)
        lets the server's own page through: its Origin names the Host it was served from."""
        if not origin:
            return False
        given = origin.strip().rstrip("/").lower()
        parts = urlsplit(given if "://" in given else f"//{given}")
        if host and parts.scheme in ("http", "https") and parts.netloc == host.strip().lower():
            return True
        if not self.origins:
            return False
        if self.relaxed:
            return True
        for o in self.origins:
            if o == CORS_LOOPBACK:
                if parts.scheme in ("http", "https", "") and parts.hostname and is_loopback(parts.hostname):
                    return True
            elif o.rstrip("/").lower() in (given, parts.netloc):  # a full origin, or a bare host[:port]
                return True
        return False

"""serve --ui-mcp-proxy (llama-server's MCP CORS proxy), in llama.cpp's test_proxy.py cases that
need no internet: off by default (403), every disallowed or malformed target a 400, exact
--ui-mcp-proxy-allow hosts let through (and nothing near them), a 204 handed back empty, the
request's body forwarded with only the headers named as x-llama-server-proxy-header-NAME (as
llama-server's test_security.py: this server's key, cookies, Proxy-Authorization not), an event stream relayed
as it comes, redirects handed back, never followed. Over real sockets: a local target server and
the app under uvicorn in a thread.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest
import requests

from mlxcel_py.server import cors_proxy

SEEN: list[dict] = []


class Target(BaseHTTPRequestHandler):
    """The MCP server stand-in: echoes what it got, or answers 204, a redirect, or an event stream."""

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        SEEN.append(
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
        )
        if self.path.startswith("/empty"):
            self.send_response(204)
            self.end_headers()
        elif self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/events"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Mcp-Session-Id", "abc")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"data: {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.05)
        else:
            out = json.dumps({"method": self.command, "path": self.path, "body": body.decode()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Set-Cookie", "session=target")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def target():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def _serve(proxy: bool, allow: tuple[str, ...] = (), keys: tuple[str, ...] = ()):
    """The app (no model: the proxy needs none) under uvicorn on an ephemeral port."""
    import uvicorn

    from mlxcel_py.server.app import create_app
    from mlxcel_py.server.security import AccessPolicy

    app = create_app(access=AccessPolicy(api_keys=keys))
    app.state.mcp_proxy, app.state.mcp_proxy_allow = proxy, allow
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def proxies():
    running = {}

    def get(proxy: bool, allow: tuple[str, ...] = (), keys: tuple[str, ...] = ()):
        key = (proxy, allow, keys)
        if key not in running:
            running[key] = _serve(proxy, allow, keys)
        return running[key][2]

    yield get
    for server, thread, _ in running.values():
        server.should_exit = True
        thread.join(timeout=10)


def _via(base: str, url: str) -> str:
    return f"{base}/cors-proxy?url={quote(url, safe='')}"


def test_off_by_default_is_a_403(proxies):
    r = requests.get(_via(proxies(False), "http://example.com/"))
    assert r.status_code == 403 and "--ui-mcp-proxy" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "url",
    [
        "http://user@example.com/",
        "http://user:password@example.com/",
        "http://10.0.0.1:1/",
        "http://127.0.0.1:1/",
        "http://169.254.169.254/",
        "http://[::1]:1/",
        "http://[::ffff:127.0.0.1]:1/",
        "http://metadata.google.internal/",
        "http://metadata.goog./",
        "http://localhost:1/",
        "http://100.64.0.1/",
        "http://[fe80::1]/",
        "http://224.0.0.1/",
        "http://0.0.0.0/",
    ],
)
def test_targets_that_are_not_public_are_refused(proxies, url):
    _refused(proxies, url)


@pytest.mark.parametrize(
    "url",
    [
        "not-a-url",
        "ftp://example.com/",
        "http://@example.com/",
        "http://example.com:not-a-port/",
        "http://example.com:65536/",
        "http://[::1",
        "http://[::1]suffix/",
        "http://example.com?query",
        "",
    ],
)
def test_malformed_urls_are_a_client_error(proxies, url):
    _refused(proxies, url)


def _refused(proxies, url: str) -> None:
    r = requests.get(_via(proxies(True), url))
    assert r.status_code == 400 and "error" in r.json()


def test_an_allowed_host_is_reached_with_the_body_and_headers(proxies, target):
    base = proxies(True, ("127.0.0.1",))
    r = requests.post(
        _via(base, target + "/mcp?x=1"),
        json={"jsonrpc": "2.0", "id": 1},
        headers={
            # llama-server's rule (its test_security.py): only what the client names explicitly goes on
            "x-llama-server-proxy-header-mcp-session-id": "s1",
            "x-llama-server-proxy-header-authorization": "Bearer for-the-target",
            "Authorization": "Bearer for-this-server",
            "Proxy-Authorization": "Basic secret",
            "X-Api-Key": "sk-other",
            "Cookie": "ours=1",
            "x-llama-server-proxy-header-": "nameless",
            "x-llama-server-proxy-header-host": "evil.example",
        },
    )
    assert r.status_code == 200, r.text
    got = r.json()
    assert got == {"method": "POST", "path": "/mcp?x=1", "body": json.dumps({"jsonrpc": "2.0", "id": 1})}
    seen = SEEN[-1]["headers"]
    assert seen.get("mcp-session-id") == "s1" and seen.get("authorization") == "Bearer for-the-target"
    assert seen.get("content-type") == "application/json"  # the body's own type
    for gone in ("cookie", "proxy-authorization", "x-api-key"):
        assert gone not in seen, gone
    assert not any(k.startswith("x-llama-server-proxy-header") for k in seen)
    assert seen["host"] == target.removeprefix("http://")
    assert "set-cookie" not in {k.lower() for k in r.headers}


def test_this_servers_own_key_is_not_forwarded(proxies, target):
    base = proxies(True, ("127.0.0.1",), ("sk-ours",))
    r = requests.get(_via(base, target + "/x"), headers={"Authorization": "Bearer sk-ours"})
    assert r.status_code == 200 and "authorization" not in SEEN[-1]["headers"]
    explicit = {"Authorization": "Bearer sk-ours", "x-llama-server-proxy-header-authorization": "Bearer sk-ours"}
    r = requests.get(_via(base, target + "/x"), headers=explicit)  # not even when named explicitly
    assert r.status_code == 200 and "authorization" not in SEEN[-1]["headers"]
    assert requests.get(_via(base, target + "/x")).status_code == 401  # the route itself needs the key


def test_allow_is_exact_and_normalized_and_keeps_the_rest_of_the_policy(proxies, target):
    port = target.rsplit(":", 1)[1]
    assert requests.get(_via(proxies(True, ("127.0.0.10",)), target + "/x")).status_code == 400
    assert requests.get(_via(proxies(True, ("127.0.0.1.".upper(),)), target + "/x")).status_code == 200
    near = proxies(True, ("192.0.2.1",))
    for url in ("http://127.0.0.1:1/", "http://169.254.169.254/", f"http://[::1]:{port}/", "http://metadata.goog/"):
        assert requests.get(_via(near, url)).status_code == 400


def test_no_content_redirects_and_event_streams_come_back_as_sent(proxies, target):
    base = proxies(True, ("127.0.0.1",))
    r = requests.post(_via(base, target + "/empty"), json={})
    assert r.status_code == 204 and r.content == b""
    r = requests.get(_via(base, target + "/moved"), allow_redirects=False)
    assert r.status_code == 302 and r.headers["Location"].startswith("http://169.254.169.254/")
    assert SEEN[-1]["path"] == "/moved"  # the metadata address was never asked
    with requests.get(_via(base, target + "/events"), stream=True) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream"
        assert r.headers["Mcp-Session-Id"] == "abc"
        assert b"".join(r.iter_content(None)) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


def test_an_unreachable_allowed_target_is_a_502_and_the_server_keeps_serving(proxies, target):
    base = proxies(True, ("127.0.0.1",))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    r = requests.get(_via(base, f"http://127.0.0.1:{closed}/"))
    assert r.status_code == 502 and "error" in r.json()
    assert requests.get(_via(base, target + "/x")).status_code == 200


def test_a_name_is_checked_by_every_address_it_resolves_to(monkeypatch):
    # a public-looking name that resolves to a private address is refused before any connection
    # (the proxy's lookup on the event loop and --image-url-fetch's in a route's thread alike)
    from mlxcel_py.server import addresses

    def infos(host, port, type=0):
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, 1, 6, "", ("10.1.2.3", port)),
        ]

    async def resolves_private(host, port, type=0):
        return infos(host, port, type)

    target = addresses.parse("http://mcp.example.com/")
    strict, allowing = addresses.Policy(), addresses.Policy.of(["MCP.example.com."])

    async def check():
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(loop, "getaddrinfo", resolves_private)
        with pytest.raises(cors_proxy.ApiError) as e:
            await addresses.address_of(target, strict)
        assert "10.1.2.3" in e.value.message and e.value.status == 400
        # allowed by name, the same name goes through (to the first address it gave)
        assert await addresses.address_of(target, allowing) == "93.184.215.14"

    asyncio.run(check())
    monkeypatch.setattr(addresses.socket, "getaddrinfo", infos)
    with pytest.raises(cors_proxy.ApiError, match="10.1.2.3"):
        addresses.address_of_now(target, strict)
    assert addresses.address_of_now(target, allowing) == "93.184.215.14"


def test_the_flags_reach_the_options(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from mlxcel_py.cli import app
    from mlxcel_py.server import main as server_main

    seen = []
    monkeypatch.setattr(server_main, "run_server", lambda cfg, **kw: seen.append(cfg.options.server))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("LLAMA_ARG_UI_MCP_PROXY_ALLOW", "10.0.0.5")
    runner = CliRunner()
    assert runner.invoke(app, ["serve", "--webui-mcp-proxy"]).exit_code == 0
    assert runner.invoke(app, ["serve", "--ui-mcp-proxy", "--ui-mcp-proxy-allow", "a.lan,b.lan"]).exit_code == 0
    assert [(s.mcp_proxy, s.mcp_proxy_allow) for s in seen] == [(True, ("10.0.0.5",)), (True, ("a.lan", "b.lan"))]

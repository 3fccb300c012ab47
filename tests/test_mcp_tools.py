"""serve --mcp-servers-config / --mcp-servers-json: MCP servers' tools at /tools (server/tools/mcp.py).
A small MCP server written here (stdio, one JSON message a line) plays every case: tools, an
error result, a JSON-RPC error, notifications and junk between replies, a crash, a slow call, a
grandchild holding its pipes. Then the real server over a socket, and the flags' refusals.
llama.cpp's own test_mcp_servers.py passes against this server too (scripts/llama_cpp_suite.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from mlxcel_py.errors import UsageError
from mlxcel_py.server.tools.mcp import McpServers, parse_configs, read_configs

SERVER = r"""
import json, os, subprocess, sys, time
calls = {"n": 0}
TOOLS = [
    {"name": "echo", "description": "Echo", "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}},
    {"name": "broken", "description": "Says it failed"},
    {"name": "rpcfail", "description": "A JSON-RPC error"},
    {"name": "slow", "description": "Sleeps"},
    {"name": "crash", "description": "Exits mid-call"},
]
if "--grandchild" in sys.argv:  # leaves a process holding our stdout
    subprocess.Popen(["sleep", "60"], stdout=sys.stdout, stderr=sys.stderr)
def send(obj, extra=b""):
    sys.stdout.buffer.write(extra + json.dumps(obj).encode() + b"\n")
    sys.stdout.buffer.flush()
for line in sys.stdin.buffer:
    req = json.loads(line)
    if "id" not in req:
        continue
    rid, method, params = req["id"], req["method"], req.get("params", {})
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2024-11-05", "capabilities": {}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name, args = params["name"], params.get("arguments", {})
        calls["n"] += 1
        # a notification, a junk line and a stale reply first, in the same write as the answer
        noise = (json.dumps({"jsonrpc": "2.0", "method": "notifications/progress"}) + "\nnot json\n"
                 + json.dumps({"jsonrpc": "2.0", "id": -1, "result": {}}) + "\n").encode()
        if name == "echo":
            text = f"echo: {args.get('message')} (call {calls['n']}, pid {os.getpid()}, keys {sorted(args)})"
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}, {"type": "image"}]}}, noise)
        elif name == "broken":
            send({"jsonrpc": "2.0", "id": rid, "result": {"isError": True, "content": [{"type": "text", "text": "it broke"}]}})
        elif name == "rpcfail":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "transient error"}})
        elif name == "slow":
            time.sleep(float(args.get("seconds", 5)))
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "done"}]}})
        elif name == "crash":
            os._exit(3)
"""


@pytest.fixture
def script(tmp_path) -> str:
    path = tmp_path / "mcp_server.py"
    path.write_text(SERVER)
    return str(path)


def _servers(script: str, *extra: str, timeout_ms: int = 30000, said=None) -> McpServers:
    config = {"mcpServers": {"t": {"command": sys.executable, "args": [script, *extra], "timeout_ms": timeout_ms}}}
    servers = McpServers(parse_configs(json.dumps(config), "test"), (said if said is not None else []).append)
    servers.warm_up()
    return servers


def test_configs_are_read_as_cursor_writes_them(tmp_path):
    text = json.dumps(
        {"mcpServers": {"a": {"command": "x", "args": ["1"], "env": {"K": "v"}, "timeout_ms": 5}, "b": {"args": []}}}
    )
    (cfg,) = parse_configs(text, "--mcp-servers-json")  # b has no command: left out
    assert (cfg.name, cfg.command, cfg.args, cfg.env, cfg.timeout_ms) == ("a", "x", ("1",), (("K", "v"),), 5)
    assert parse_configs("{}", "x") == [] and parse_configs('{"mcpServers": []}', "x") == []
    for bad, message in (
        ("not json", "not valid JSON"),
        ('{"mcpServers": {"a": 1}}', "must be an object"),
        ('{"mcpServers": {"a": {"command": "x", "args": "y"}}}', "'args' must be a list of strings"),
        ('{"mcpServers": {"a": {"command": "x", "timeout_ms": 0}}}', "'timeout_ms' must be a positive integer"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_configs(bad, "--mcp-servers-json")
    with pytest.raises(UsageError, match="--mcp-servers-config /no/such.json: cannot read it"):
        read_configs("/no/such.json", None, print)
    path = tmp_path / "c.json"
    path.write_text(text)
    said: list[str] = []
    both = read_configs(
        str(path), json.dumps({"mcpServers": {"a": {"command": "y"}, "c": {"command": "z"}}}), said.append
    )
    assert [(c.name, c.command) for c in both] == [("a", "x"), ("c", "z")] and "configured twice" in said[0]


def test_tools_are_listed_called_and_their_failures_are_errors(script):
    said: list[str] = []
    servers = _servers(script, said=said)
    try:
        tools = {t.name: t for t in servers.as_tools({"t_slow"})}  # a name already taken is skipped
        assert sorted(tools) == ["t_broken", "t_crash", "t_echo", "t_rpcfail"] and "t_slow collides" in said[-1]
        echo = tools["t_echo"].describe()
        assert echo["type"] == "mcp" and echo["definition"]["function"]["parameters"]["properties"]["message"]
        assert tools["t_broken"].definition["function"]["parameters"] == {}
        out = tools["t_echo"].call({"message": "hi", "cwd": "/x", "runtime": "ssh:h"}, None, None)
        # noise before the reply was skipped; the route's own keys never reach the server
        assert (
            out["plain_text_response"].startswith("echo: hi (call 1,")
            and "keys ['message']" in out["plain_text_response"]
        )
        again = tools["t_echo"].call({"message": "again"}, None, None)["plain_text_response"]
        assert "(call 2," in again  # the same process: warmup's was stopped, this one stays
        assert tools["t_broken"].call({}, None, None) == {"error": "it broke"}
        assert tools["t_rpcfail"].call({}, None, None) == {"error": "transient error"}
        # a crash ends that call; the next one starts the server again
        assert tools["t_crash"].call({}, None, None) == {"error": "transport closed"}
        assert "(call 1," in tools["t_echo"].call({"message": "back"}, None, None)["plain_text_response"]
    finally:
        servers.stop()


def test_concurrent_calls_take_turns_and_each_gets_its_own_reply(script):
    servers = _servers(script)
    try:
        (echo,) = [t for t in servers.as_tools(set()) if t.name == "t_echo"]
        results: dict[int, str] = {}

        def call(i: int) -> None:
            results[i] = echo.call({"message": f"m{i}"}, None, None)["plain_text_response"]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert all(results[i].startswith(f"echo: m{i} ") for i in range(10))
    finally:
        servers.stop()


def test_a_slow_call_times_out_and_shutdown_cancels_one_in_flight(script):
    servers = _servers(script, timeout_ms=500)
    (slow,) = [t for t in servers.as_tools(set()) if t.name == "t_slow"]
    start = time.monotonic()
    assert slow.call({"seconds": 5}, None, None) == {"error": "request timed out"}
    assert time.monotonic() - start < 3
    servers.stop()
    patient = _servers(script, timeout_ms=30000)
    (slow,) = [t for t in patient.as_tools(set()) if t.name == "t_slow"]
    got: list[dict] = []
    worker = threading.Thread(target=lambda: got.append(slow.call({"seconds": 20}, None, None)))
    worker.start()
    time.sleep(1)
    start = time.monotonic()
    patient.stop()
    worker.join(timeout=10)
    assert time.monotonic() - start < 2 and got and "error" in got[0]
    assert patient.call("t", "echo", {}) == {"error": "MCP server unavailable: t"}  # stopped for good


def test_a_server_that_cannot_start_loses_its_tools_only(script):
    said: list[str] = []
    config = {
        "mcpServers": {
            "bad": {"command": "no_such_mcp_server_12345"},
            "good": {"command": sys.executable, "args": [script]},
        }
    }
    servers = McpServers(parse_configs(json.dumps(config), "x"), said.append)
    servers.warm_up()
    try:
        assert {t.name.split("_")[0] for t in servers.as_tools(set())} == {"good"}
        assert any("bad: cannot start" in s for s in said)
        assert servers.call("bad", "x", {}) == {"error": "MCP server unavailable: bad"}
    finally:
        servers.stop()


def test_a_grandchild_holding_the_pipes_hangs_neither_a_call_nor_the_stop(script, tmp_path):
    mark = f"mcp-grandchild-{os.getpid()}-{time.time_ns()}"
    config = {"mcpServers": {"t": {"command": sys.executable, "args": [script, "--grandchild"], "env": {"MARK": mark}}}}
    start = time.monotonic()
    servers = McpServers(parse_configs(json.dumps(config), "x"))
    servers.warm_up()
    try:
        (echo,) = [t for t in servers.as_tools(set()) if t.name == "t_echo"]
        assert "echo: x" in echo.call({"message": "x"}, None, None)["plain_text_response"]
        assert _marked(mark)  # the grandchild runs, holding the server's stdout
    finally:
        servers.stop()
    assert time.monotonic() - start < 10
    time.sleep(0.5)
    assert not _marked(mark)  # it went with its server's process group


def _marked(mark: str) -> list[str]:
    """Processes whose environment carries `mark` (the server's and whatever it started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"MARK={mark}".encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("router", [False, True], ids=["server", "router"])
def test_the_real_server_lists_and_runs_mcp_tools_and_stops_promptly_with_a_call_in_flight(
    tiny_dir, tmp_path, script, router
):
    """A model's server and a router (which serves /tools itself) alike: SIGTERM ends the MCP call
    in flight at once (the router used to wait for it, then be killed)."""
    from test_server import post, start_server

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"), LLAMA_CACHE=str(tmp_path))
    config = json.dumps({"mcpServers": {"t": {"command": sys.executable, "args": [script]}}})
    model = ["--models-dir", str(tmp_path)] if router else ["-m", str(tiny_dir), "--no-warmup"]
    proc, url, lines = start_server(env, *model, "--mcp-servers-json", config)
    try:
        assert any("MCP: t: 5 tools" in ln for ln in lines)
        import urllib.request

        with urllib.request.urlopen(url + "/tools", timeout=30) as r:
            listed = [t["tool"] for t in json.loads(r.read())]
        assert listed == ["t_echo", "t_broken", "t_rpcfail", "t_slow", "t_crash"]  # no built-in tools asked for
        status, out = post(url + "/tools", {"tool": "t_echo", "params": {"message": "hello"}})
        assert status == 200 and out["plain_text_response"].startswith("echo: hello")
        threading.Thread(
            target=lambda: post(url + "/tools", {"tool": "t_slow", "params": {"seconds": 20}}), daemon=True
        ).start()
        time.sleep(1.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.monotonic() - start < 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mcp-servers-json", "not valid json"], "--mcp-servers-json: not valid JSON"),
        (
            ["--mcp-servers-config", "/nonexistent/path.json"],
            "--mcp-servers-config /nonexistent/path.json: cannot read",
        ),
    ],
)
def test_a_bad_mcp_config_is_a_usage_error(args, message, tiny_dir, cli_env):
    from conftest import mlxcel_cmd

    r = subprocess.run(
        mlxcel_cmd() + ["serve", "-m", str(tiny_dir), "--port", "0", *args],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr

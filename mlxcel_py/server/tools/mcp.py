"""MCP servers' tools at /tools (`--mcp-servers-config FILE`, `--mcp-servers-json JSON`; llama-server's,
experimental there too): each server in Cursor's `{"mcpServers": {NAME: {"command", "args", "env",
"cwd", "timeout_ms"}}}` layout is a process spoken to over stdio in MCP's JSON-RPC (one JSON message
a line), and each of its tools is listed here as `NAME_TOOL`.

At startup every server is started, asked for its tools (10 s at most each) and stopped again: a
server that cannot start or answer contributes no tools and does not stop this one. A call starts
the server again when none runs (a crashed one included); one that fails to start is not tried
again for 5 s. Calls to one server go one at a time, each within its `timeout_ms` (30 s by
default); notifications, replies to calls that timed out and lines that are not JSON are skipped.
A tool's text parts are its `plain_text_response`; `isError` or a JSON-RPC error is `{"error"}`,
as llama-server answers. Each server runs in a process group of its own, so stopping it stops
anything it started, and a grandchild holding its pipes cannot hang a read or the shutdown.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import UsageError
from .builtin import Tool

PROTOCOL_VERSION = "2024-11-05"
WARMUP_TIMEOUT_S = 10.0
COOLDOWN_S = 5.0
MAX_LINE = 8 << 20  # a longer line is dropped, so a server that never ends one cannot fill memory
POLL_S = 0.05  # how often a waiting call looks at the shutdown flag


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""
    timeout_ms: int = 30000


def parse_configs(text: str, where: str) -> list[McpServerConfig]:
    """Cursor's layout; a server without a command is skipped (said by the caller); any other
    shape error is a usage error naming `where` (the flag)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON ({exc})") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        return []
    out = []
    for name, cfg in servers.items():
        if not isinstance(cfg, dict):
            raise UsageError(f"{where}: server {name!r} must be an object")
        command, args, env = cfg.get("command", ""), cfg.get("args", []), cfg.get("env", {})
        cwd, timeout = cfg.get("cwd", ""), cfg.get("timeout_ms", 30000)
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise UsageError(f"{where}: server {name!r}: 'args' must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise UsageError(f"{where}: server {name!r}: 'env' must map names to strings")
        if not isinstance(command, str) or not isinstance(cwd, str):
            raise UsageError(f"{where}: server {name!r}: 'command' and 'cwd' must be strings")
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise UsageError(f"{where}: server {name!r}: 'timeout_ms' must be a positive integer")
        if command:
            out.append(McpServerConfig(name, command, tuple(args), tuple(env.items()), cwd, timeout))
    return out


def read_configs(path: str | None, inline: str | None, say: Callable[[str], None]) -> list[McpServerConfig]:
    """--mcp-servers-config's file, then --mcp-servers-json's servers (a name already taken is skipped)."""
    found: list[McpServerConfig] = []
    sources = []
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                sources.append((f.read(), f"--mcp-servers-config {path}"))
        except OSError as exc:
            raise UsageError(f"--mcp-servers-config {path}: cannot read it ({exc.strerror})") from None
    if inline:
        sources.append((inline, "--mcp-servers-json"))
    for text, where in sources:
        for cfg in parse_configs(text, where):
            if any(c.name == cfg.name for c in found):
                say(f"MCP: server {cfg.name!r} is configured twice; the first is kept")
            else:
                found.append(cfg)
    return found


class McpError(Exception):
    pass


class Transport:
    """One running MCP server over stdio."""

    def __init__(self, cfg: McpServerConfig):
        self.cfg = cfg
        self.lines: queue.Queue = queue.Queue()
        self.lock = threading.Lock()  # one call at a time
        self.next_id = 1
        self.initialized = False
        self.tools: list[dict] | None = None
        self.proc: subprocess.Popen | None = None
        self.last_error = ""
        self.ended = False

    def start(self) -> bool:
        env = {**os.environ, **dict(self.cfg.env)}
        try:
            self.proc = subprocess.Popen(
                [self.cfg.command, *self.cfg.args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=self.cfg.cwd or None,
                env=env,
                start_new_session=True,  # its own group: stopping it stops what it started
            )
        except OSError as exc:
            self.last_error = f"cannot start {self.cfg.command}: {exc.strerror or exc}"
            return False
        threading.Thread(target=self._read, args=(self.proc,), name=f"mcp-{self.cfg.name}", daemon=True).start()
        return True

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline(MAX_LINE + 1)
            if not line:
                break
            if len(line) > MAX_LINE:  # the rest of an oversized line is dropped too
                while line and not line.endswith(b"\n"):
                    line = proc.stdout.readline(MAX_LINE + 1)
                continue
            self.lines.put(line)
        self.ended = True  # its output closed: it exited (or is exiting), whatever poll says yet
        self.lines.put(None)

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.ended and self.proc.poll() is None

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass

    def _rpc(self, method: str, params: dict | None, deadline: float, stopping: Callable[[], bool]) -> dict:
        """Send a request and wait for its reply (skipping notifications and stale replies)."""
        rid = self.next_id
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        self._send(message)
        while True:
            if stopping():
                raise McpError("cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                raise McpError("request timed out")
            try:
                line = self.lines.get(timeout=min(left, POLL_S))
            except queue.Empty:
                continue
            if line is None:
                self.lines.put(None)  # stays closed for the next reader
                raise McpError("transport closed")
            try:
                reply = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(reply, dict) and reply.get("id") == rid:
                return reply

    def _send(self, message: dict) -> None:
        if self.proc is None or self.proc.stdin is None:
            raise McpError("transport closed")
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise McpError("transport closed") from None

    def _ensure_init(self, deadline: float, stopping: Callable[[], bool]) -> None:
        if self.initialized:
            return
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "mlxcel-py"}}
        reply = self._rpc("initialize", params, deadline, stopping)
        if "result" not in reply:
            raise McpError(f"initialize failed: {_rpc_error(reply)}")
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.initialized = True

    def list_tools(self, timeout: float, stopping: Callable[[], bool]) -> list[dict]:
        with self.lock:
            deadline = time.monotonic() + timeout
            self._ensure_init(deadline, stopping)
            if self.tools is None:
                reply = self._rpc("tools/list", None, deadline, stopping)
                if "result" not in reply:
                    raise McpError(f"tools/list failed: {_rpc_error(reply)}")
                listed = reply["result"].get("tools", []) if isinstance(reply["result"], dict) else []
                self.tools = [t for t in listed if isinstance(t, dict) and isinstance(t.get("name"), str)]
            return self.tools

    def call(self, tool: str, arguments: dict, stopping: Callable[[], bool]) -> dict:
        with self.lock:
            deadline = time.monotonic() + self.cfg.timeout_ms / 1000
            try:
                self._ensure_init(deadline, stopping)
                reply = self._rpc("tools/call", {"name": tool, "arguments": arguments}, deadline, stopping)
            except McpError as exc:
                return {"error": str(exc)}
            if "error" in reply:
                return {"error": _rpc_error(reply)}
            if "result" in reply:
                return _response(reply["result"])
            return {"error": "invalid response from MCP server"}


def _rpc_error(reply: dict) -> str:
    err = reply.get("error")
    if isinstance(err, dict):
        return str(err.get("message", "unknown error"))
    return err if isinstance(err, str) else "unknown error"


def _response(result: Any) -> dict:
    """A tools/call result as /tools answers: its text parts joined; isError as an error."""
    parts = result.get("content") if isinstance(result, dict) else None
    texts = [p.get("text", "") for p in parts or [] if isinstance(p, dict) and p.get("type") == "text"]
    text = "\n".join(t for t in texts if isinstance(t, str))
    if isinstance(result, dict) and result.get("isError"):
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


@dataclass
class McpServers:
    configs: list[McpServerConfig]
    say: Callable[[str], None] = lambda s: None
    tools: list[tuple[str, dict]] = field(default_factory=list)  # (server, its tool's listing)
    _running: dict[str, Transport] = field(default_factory=dict)
    _cooling: dict[str, float] = field(default_factory=dict)  # server -> when it may be started again
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def warm_up(self) -> None:
        """Start each server, list its tools, stop it (a failing one only loses its tools)."""
        for cfg in self.configs:
            t = Transport(cfg)
            try:
                if not t.start():
                    self.say(f"MCP: {cfg.name}: {t.last_error}; its tools are left out")
                    continue
                listed = t.list_tools(WARMUP_TIMEOUT_S, self._stopping.is_set)
                self.tools += [(cfg.name, d) for d in listed]
                self.say(f"MCP: {cfg.name}: {len(listed)} tool{'s' if len(listed) != 1 else ''}")
            except McpError as exc:
                self.say(f"MCP: {cfg.name}: {exc}; its tools are left out")
            finally:
                t.close()

    def _transport(self, name: str) -> Transport | None:
        stale: list[Transport] = []
        with self._lock:
            if self._stopping.is_set() or time.monotonic() < self._cooling.get(name, 0.0):
                return None
            t = self._running.get(name)
            if t is not None and t.alive:
                return t
            if t is not None:
                stale.append(self._running.pop(name))
            cfg = next((c for c in self.configs if c.name == name), None)
            fresh = Transport(cfg) if cfg is not None else None
            if fresh is not None and fresh.start():
                self._running[name] = fresh
            elif fresh is not None:
                self._cooling[name] = time.monotonic() + COOLDOWN_S
                stale.append(fresh)
                fresh = None
        for s in stale:
            s.close()
        return fresh

    def call(self, server: str, tool: str, arguments: dict) -> dict:
        t = self._transport(server)
        if t is None:
            return {"error": f"MCP server unavailable: {server}"}
        return t.call(tool, arguments, self._stopping.is_set)

    def stop(self) -> None:
        """Shutting down: calls in flight end ("cancelled") within POLL_S, and every server stops."""
        self._stopping.set()
        with self._lock:
            running, self._running = list(self._running.values()), {}
        for t in running:
            t.close()

    def as_tools(self, taken: set[str]) -> list[Tool]:
        """Each listed tool as `SERVER_TOOL` (a name a built-in tool or an earlier one has is skipped)."""
        out = []
        for server, d in self.tools:
            name = f"{server}_{d['name']}"
            if name in taken:
                self.say(f"MCP: tool {name} collides with another tool's name; skipped")
                continue
            taken.add(name)
            schema = d.get("inputSchema") if isinstance(d.get("inputSchema"), dict) else {}
            definition = {
                "type": "function",
                "function": {"name": name, "description": str(d.get("description", "")), "parameters": schema},
            }
            out.append(Tool(name, name, definition, _caller(self, server, d["name"]), kind="mcp", uses_cwd=False))
        return out


def _caller(servers: McpServers, server: str, tool: str):
    def call(params: dict, _io=None, _push=None) -> dict:
        arguments = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
        return servers.call(server, tool, arguments)

    return call

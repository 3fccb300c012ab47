"""llama-server's built-in agent tools (`serve --tools NAMES|all`, experimental there too): a
client, such as its web UI in agent mode, lists them (GET /tools), hands their definitions to
the model, and runs the calls the model makes through POST /tools.

- builtin.py: the seven tools (read, search, grep, run a command, write, edit, system info);
- io.py: where they run: this host or an isolate (a container, an ssh host);
- runtime.py: `--tools-runtime`, the isolate every call uses unless its request names one;
- mcp.py: MCP servers' tools (`--mcp-servers-config`, `--mcp-servers-json`), listed beside them;
- routes.py: the two routes.

These run commands and write files as the server's user. They are off unless named; the server
binds loopback and lets only loopback pages call it by default, and an API key guards /tools
like every other route. Do not turn them on where untrusted clients can reach the server.
"""

from __future__ import annotations

from dataclasses import dataclass

from .builtin import TOOLS, Tool, select
from .io import stop_all
from .mcp import McpServers
from .runtime import ToolsRuntime

__all__ = ["TOOLS", "McpServers", "ServerTools", "Tool", "select"]


@dataclass
class ServerTools:
    tools: list[Tool]
    runtime: ToolsRuntime | None = None
    mcp: McpServers | None = None

    def shutting_down(self) -> None:
        """SIGTERM: MCP calls and tool commands in flight end now, so the requests waiting on them
        let the server stop, and no command outlives it."""
        if self.mcp is not None:
            self.mcp.stop()
        stop_all()

    def close(self) -> None:
        self.shutting_down()
        if self.runtime is not None:
            self.runtime.close()

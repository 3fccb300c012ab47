"""GET /tools and POST /tools: llama-server's built-in tools over HTTP (`--tools`; 403 without).

GET lists the enabled tools (name, display name, write permission, the function definition a
client gives its model). POST `{"tool", "params", "stream"}` runs one and answers its JSON; with
`stream: true` (exec_shell_command) an SSE stream of `{"chunk"}` events ends with `{"done": true}`
(and `error` if it failed), and a client that leaves kills the command.

Three headers belong to the client, not the model, and replace whatever the params say:
`x-tool-cwd` (relative paths and the command's folder), `x-tool-runtime` (an isolate: a running
container or an ssh host; else `--tools-runtime`'s, else this host) and `x-resp-type: base64`
(read_file's raw bytes). Calls run on threads of their own, never on the event loop or the model's.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..http import ApiError, read_json
from .builtin import ParamError, Tool
from .io import ToolRuntimeError, make_io

router = APIRouter()


def _enabled(request: Request) -> Any:
    tools = getattr(request.app.state, "tools", None)
    if tools is None:
        raise ApiError(
            "the built-in tools are off; start the server with --tools to turn them on",
            status=403,
            type="forbidden_error",
        )
    return tools


@router.get("/tools")
async def list_tools(request: Request):
    return [t.describe() for t in _enabled(request).tools]


@router.post("/tools")
async def call_tool(request: Request):
    server_tools = _enabled(request)
    body = await read_json(request, request.app.state.body_limit)
    name, params, stream = body.get("tool"), body.get("params", {}), body.get("stream", False)
    if not isinstance(name, str):
        raise ApiError("'tool' must name a tool")
    if not isinstance(params, dict) or not isinstance(stream, bool):
        raise ApiError("'params' must be an object and 'stream' true or false")
    tool = next((t for t in server_tools.tools if t.name == name), None)
    if tool is None:
        raise ApiError(f'unknown tool "{name}"', status=404)
    if stream and not tool.stream:
        raise ApiError(f'tool "{name}" does not support stream = true', status=404)
    params = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
    headers = request.headers
    if cwd := headers.get("x-tool-cwd"):
        params["cwd"] = cwd
    runtime = headers.get("x-tool-runtime") or (server_tools.runtime.spec() if server_tools.runtime else "")
    if resp_type := headers.get("x-resp-type"):
        params["resp_type"] = resp_type
    if runtime:
        params["runtime"] = runtime  # get_info reports from inside it
    try:
        io = make_io(params.get("cwd", ""), runtime)
    except ToolRuntimeError as exc:
        raise ApiError(str(exc), status=500, type="server_error") from None
    if stream:
        return _streamed(tool, params, io)
    try:
        result = await asyncio.to_thread(tool.call, params, io, None)
    except ParamError as exc:
        raise ApiError(f"{name}: {exc}") from None
    return JSONResponse(result)


def _streamed(tool: Tool, params: dict, io: Any) -> StreamingResponse:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()  # the client left: the next chunk stops the command

    def hand_over(item: dict) -> bool:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop closed (shutdown): nobody reads any more
            gone.set()
            return False
        return True

    def push(chunk: str) -> bool:
        if chunk and not hand_over({"chunk": chunk}):
            return False
        return not gone.is_set()

    def work() -> None:
        end: dict = {"done": True}
        try:
            tool.call(params, io, push)
        except ParamError as exc:
            end["error"] = f"{tool.name}: {exc}"
        except Exception as exc:  # reported in the stream's last event; the server goes on
            end["error"] = f"{type(exc).__name__}: {exc}"
        hand_over(end)

    async def events():
        thread = threading.Thread(target=work, name=f"tool-{tool.name}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                yield f"data: {json.dumps(item)}\n\n"
                if item.get("done"):
                    return
        finally:
            gone.set()

    return StreamingResponse(events(), media_type="text/event-stream")

"""OpenAI's Responses API: `POST /v1/responses`, for clients built on `client.responses.create`.

Stateless, as llama-server offers it: `input` as a string or a list of items (messages with text
content, `function_call` and `function_call_output` items from an earlier turn), `instructions`
(the system turn), `max_output_tokens`, sampling, function `tools` with `tool_choice`, and
`text.format` (json_object / json_schema: structured output, speculation on). The reply is the
same generation the chat route runs (same template, drafter, tool-call handling). Streaming sends
the Responses event sequence (response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta..., output_text.done, content_part.done, output_item.done,
response.completed), each with its sequence_number; a reply with tools is sent when complete (it
is parsed whole), as function_call items with their argument events, or as a message.
`previous_response_id` is refused: nothing is stored, so the whole conversation comes as input.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from . import tool_calls
from .context import ctx_of
from .http import ApiError
from .responses import sse_event, timings
from .schemas import ResponsesRequest

router = APIRouter()


def _usage(r) -> dict:
    st = r.stats
    return {
        "input_tokens": st.prompt_tokens,
        "input_tokens_details": {"cached_tokens": st.cached_tokens},
        "output_tokens": st.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": st.prompt_tokens + st.generated_tokens,
    }


def _items(r, tools: list[dict]) -> list[dict]:
    content, calls = tool_calls.parse(r.text, tools) if tools else (r.text, [])
    out: list[dict] = []
    if content or not calls:
        out.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": content or "", "annotations": []}],
            }
        )
    for c in calls:
        call = c.as_openai()
        out.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    return out


@router.post("/v1/responses")
@router.post("/responses")  # llama-server serves its OpenAI routes unprefixed too
async def responses(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, ResponsesRequest)
    if req.model_extra and req.model_extra.get("previous_response_id"):
        raise ApiError(
            "'previous_response_id' is not supported: this server stores no responses; send the whole "
            "conversation as 'input'"
        )
    tools, grammar = ctx.requests.tools(req)
    turns = req.turns()
    prompt = await asyncio.to_thread(ctx.requests.tool_prompt, turns, tools)  # templating off the loop
    job = await ctx.requests.job(req, prompt, grammar=grammar, constraint_fields=req.format_fields())
    rid = f"resp_{uuid.uuid4().hex[:24]}"
    created = int(time.time())

    def response(status: str, output: list[dict], r=None) -> dict:
        body: dict[str, Any] = {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "model": ctx.model_id,
            "output": output,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": True,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "temperature": req.temperature,
            "top_p": req.top_p,
            "text": req.text or {"format": {"type": "text"}},
            "truncation": "disabled",
            "metadata": {},
            "error": None,
            "incomplete_details": None,
            "usage": None,
        }
        if r is not None:
            body["usage"] = _usage(r)
            if r.finish_reason == "length":
                body["status"] = "incomplete"
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            body["timings"] = timings(r.stats)  # llama-server adds its timings, streamed or not
        return body

    if not req.stream:
        r = await ctx.collect(job, request)
        return response("completed", _items(r, tools), r)
    return _stream(ctx, request, job, response, tools)


def _stream(ctx, request: Request, job, response, tools: list[dict]):
    """Responses events; llama-server's telemetry where asked: `prompt_progress` on
    `response.in_progress` events (`return_progress`), `timings` on each text delta and
    progress event (`timings_per_token`, added by `ctx.stream`), and `timings` on
    `response.completed` always."""
    seq = iter(range(1 << 62))
    mid = f"msg_{uuid.uuid4().hex[:24]}"

    def ev(kind: str, **fields) -> dict:
        return {"type": f"response.{kind}", "sequence_number": next(seq), **fields}

    def message_item(status: str, text: str | None) -> dict:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
        return {"type": "message", "id": mid, "status": status, "role": "assistant", "content": content}

    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": mid, "output_index": 0, "content_index": 0}

    def head() -> list[dict]:
        out = [
            ev("created", response=response("in_progress", [])),
            ev("in_progress", response=response("in_progress", [])),
        ]
        if not tools:
            out += [
                ev("output_item.added", output_index=0, item=message_item("in_progress", None)),
                ev("content_part.added", part=part, **where),
            ]
        return out

    def on_text(piece, _lps) -> list[dict]:
        if tools:
            return []
        return [ev("output_text.delta", delta=piece.text, **where)]

    def on_progress(p: dict) -> dict:
        return ev("in_progress", response=response("in_progress", []), prompt_progress=p)

    def on_done(r) -> list[dict]:
        if not tools:
            done_part = {**part, "text": r.text}
            item = message_item("completed", r.text)
            return [
                ev("output_text.done", text=r.text, **where),
                ev("content_part.done", part=done_part, **where),
                ev("output_item.done", output_index=0, item=item),
                ev("completed", response=response("completed", [item], r), timings=timings(r.stats)),
            ]
        items = _items(r, tools)
        out: list[dict] = []
        for i, item in enumerate(items):
            if item["type"] == "function_call":
                out += [
                    ev("output_item.added", output_index=i, item={**item, "arguments": "", "status": "in_progress"}),
                    ev("function_call_arguments.delta", item_id=item["id"], output_index=i, delta=item["arguments"]),
                    ev("function_call_arguments.done", item_id=item["id"], output_index=i, arguments=item["arguments"]),
                    ev("output_item.done", output_index=i, item=item),
                ]
            else:
                text = item["content"][0]["text"]
                w = {"item_id": item["id"], "output_index": i, "content_index": 0}
                out += [
                    ev("output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []}),
                    ev("content_part.added", part=part, **w),
                    ev("output_text.delta", delta=text, **w),
                    ev("output_text.done", text=text, **w),
                    ev("content_part.done", part=item["content"][0], **w),
                    ev("output_item.done", output_index=i, item=item),
                ]
        return out + [ev("completed", response=response("completed", items, r), timings=timings(r.stats))]

    return ctx.stream(
        job,
        request,
        on_text,
        on_done,
        head=head(),
        done_sentinel=False,
        frame=sse_event,
        on_progress=on_progress,
        on_error=lambda message, kind: {
            "type": "error",
            "sequence_number": next(seq),
            "message": message,
            "code": kind,
        },
    )


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens")
async def input_tokens(request: Request):
    """OpenAI's token count of a Responses input, rendered as `/v1/responses` would render it."""
    ctx = ctx_of(request)
    await ctx.wake()
    req = await ctx.requests.parse(request, ResponsesRequest)
    tools, _ = ctx.requests.tools(req)
    prompt = await asyncio.to_thread(ctx.requests.tool_prompt, req.turns(), tools)
    return {"object": "response.input_tokens", "input_tokens": len(prompt)}

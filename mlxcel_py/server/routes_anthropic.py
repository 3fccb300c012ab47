"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

For clients built on Anthropic's SDK (coding agents, chat front ends) pointed at a local model,
as llama-server offers it: text messages, `system`, multi-turn, `max_tokens`, `stop_sequences`,
sampling, streaming with Anthropic's event sequence (message_start, content_block_start, ping,
content_block_delta..., content_block_stop, message_delta, message_stop), errors in Anthropic's
shape, and the key as `x-api-key` (http.Guard accepts it). The reply is the same generation the
OpenAI routes run (same template, same drafter), so greedy text equals theirs. Tools (`tools` with
`input_schema`, `tool_choice` auto / any / tool / none) go through the chat route's tool-call
handling (server/tool_calls.py): calls come back as `tool_use` blocks with `stop_reason:
"tool_use"`, and `tool_use` / `tool_result` blocks of the history are rendered back; streamed, a
reply with tools is sent whole when complete (`input_json_delta` for a call's input).
"""

from __future__ import annotations

import asyncio
import json
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from . import tool_calls
from .context import ctx_of
from .http import ApiError
from .responses import sse_event
from .schemas import AnthropicCountRequest, AnthropicRequest

router = APIRouter()

STOP_REASONS = {"length": "max_tokens", "cancelled": "end_turn"}  # else end_turn, or stop_sequence


def _error(exc: ApiError) -> JSONResponse:
    kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large", 503: "overloaded_error"}
    return JSONResponse(
        {"type": "error", "error": {"type": kind.get(exc.status, "invalid_request_error"), "message": exc.message}},
        status_code=exc.status,
        headers=exc.headers,
    )


def _stop(r, blocks: list[dict]) -> tuple[str, str | None]:
    if any(b["type"] == "tool_use" for b in blocks):
        return "tool_use", None
    if r.stop_word:
        return "stop_sequence", r.stop_word
    return STOP_REASONS.get(r.finish_reason, "end_turn"), None


def _blocks(r, tools: list[dict]) -> list[dict]:
    """The reply's content blocks: its text, and a tool_use block per call (with tools)."""
    content, calls = tool_calls.parse(r.text, tools) if tools else (r.text, [])
    out = [{"type": "text", "text": content or ""}] if content or not calls else []
    return out + [
        {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": c.name, "input": c.arguments}
        for c in calls
    ]


@router.post("/v1/messages")
async def messages(request: Request):
    ctx = ctx_of(request)
    try:
        req = await ctx.requests.parse(request, AnthropicRequest)
        if req.max_tokens < 1:
            raise ApiError(f"'max_tokens' must be at least 1, got {req.max_tokens}")
        tools, grammar = ctx.requests.tools(req)
        prompt = await asyncio.to_thread(ctx.requests.tool_prompt, req.turns(), tools)  # templating off the loop
        job = await ctx.requests.job(req, prompt, grammar=grammar)
        mid = f"msg_{uuid.uuid4().hex[:24]}"
        if req.stream:
            return _stream(ctx, request, job, mid, len(prompt), tools)
        r = await ctx.collect(job, request)
    except ApiError as exc:
        return _error(exc)
    blocks = _blocks(r, tools)
    reason, sequence = _stop(r, blocks)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": ctx.model_id,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": r.stats.prompt_tokens,
            "output_tokens": r.stats.generated_tokens,
            **_cache_usage(r),
        },
    }


def _cache_usage(r) -> dict:
    """Anthropic's cache counters: the prompt tokens the prompt cache held (input_tokens still
    counts the whole prompt, as count_tokens does); nothing is written to a cache on request."""
    return {"cache_read_input_tokens": r.stats.cached_tokens, "cache_creation_input_tokens": 0}


def _stream(ctx, request: Request, job, mid: str, prompt_tokens: int, tools: list[dict]):
    start = {
        "type": "message_start",
        "message": {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": ctx.model_id,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt_tokens,
                "output_tokens": 0,
                "cache_read_input_tokens": 0,  # known once the prompt is fed: message_delta says
                "cache_creation_input_tokens": 0,
            },
        },
    }
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}

    def end(r, blocks: list[dict]) -> list[dict]:
        reason, sequence = _stop(r, blocks)
        return [
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"output_tokens": r.stats.generated_tokens, **_cache_usage(r)},
            },
            {"type": "message_stop"},
        ]

    def on_done(r) -> list[dict]:
        if not tools:
            return [{"type": "content_block_stop", "index": 0}] + end(r, [])
        # with tools the reply is parsed whole: each block now, as start, one delta, stop
        blocks = _blocks(r, tools)
        out: list[dict] = []
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                out += [
                    {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                    {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": b["text"]}},
                ]
            else:
                partial = json.dumps(b["input"], ensure_ascii=False)
                out += [
                    {"type": "content_block_start", "index": i, "content_block": {**b, "input": {}}},
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": partial},
                    },
                ]
            out.append({"type": "content_block_stop", "index": i})
        return out + end(r, blocks)

    return ctx.stream(
        job,
        request,
        lambda piece, _: (
            []
            if tools
            else {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece.text},
            }
        ),
        on_done,
        head=[start, {"type": "ping"}] if tools else [start, block, {"type": "ping"}],
        done_sentinel=False,
        frame=sse_event,
        on_error=lambda message, kind: {
            "type": "error",
            "error": {"type": "overloaded_error" if kind == "unavailable_error" else "api_error", "message": message},
        },
    )


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request):
    ctx = ctx_of(request)
    await ctx.wake()
    try:
        req = await ctx.requests.parse(request, AnthropicCountRequest)
        prompt = await asyncio.to_thread(ctx.requests.tool_prompt, req.turns(), req.tool_list())
    except ApiError as exc:
        return _error(exc)
    return {"input_tokens": len(prompt)}

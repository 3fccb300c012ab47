"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Shapes as OpenAI clients expect them: any `model` name is answered by the loaded model (named by
`--alias`), `system_fingerprint`, `usage`, streaming chunks ending in `[DONE]`; llama-server's
`timings` ride along. Logprobs are the target's own (`logprobs` + `top_logprobs` on chat, an
integer `logprobs` on completions).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request

from ..engine.text import TextPiece
from . import reasoning, tool_calls
from .context import ctx_of
from .http import ApiError
from .responses import timings, usage
from .schemas import ChatRequest, CompletionRequest

router = APIRouter()


@router.get("/v1/models")
@router.get("/models")
async def models(request: Request):
    ctx = ctx_of(request)
    return {
        "object": "list",
        "data": [{"id": ctx.model_id, "object": "model", "created": ctx.created, "owned_by": "mlxcel-py"}],
    }


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def chat_completions(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, ChatRequest)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError("'top_logprobs' needs 'logprobs': true")
    lp = (req.top_logprobs or 0) if req.logprobs else None
    tools, grammar = ctx.requests.tools(req)
    prompt = await asyncio.to_thread(ctx.requests.chat_prompt, req.messages, req.tools)  # templating off the loop
    job = ctx.requests.job(req, prompt, lp, grammar=grammar)
    # reasoning_format (llama-server): <think>...</think> into reasoning_content unless "none"
    fmt = (req.model_extra or {}).get("reasoning_format", "auto")
    if fmt not in reasoning.FORMATS:
        raise ApiError(f"'reasoning_format' must be one of {', '.join(reasoning.FORMATS)}")
    think = None if fmt == "none" else reasoning.opened_by(ctx.tokenizer.decode(prompt[-8:]))
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "created": int(time.time()),
        "model": ctx.model_id,
        "system_fingerprint": ctx.fingerprint,
    }
    # stream_options.include_usage (OpenAI): usage and timings in a last chunk of their own, choices []
    usage_chunk = _include_usage(req)
    if req.stream and tools:
        # a reply with tools is parsed whole: its call (or text) goes out when it is complete
        chunk = {**base, "object": "chat.completion.chunk"}
        return ctx.stream(
            job,
            request,
            lambda piece, lps: [],
            lambda r: _tool_stream_end(chunk, r, tools, usage_chunk, think),
            head={
                **chunk,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}],
            },
        )
    if req.stream:
        chunk = {**base, "object": "chat.completion.chunk"}
        splitter = reasoning.ReasoningSplit(think) if think is not None else None

        def piece_chunks(parts: list[tuple[str, str]], lps: list) -> list[dict]:
            return [
                {
                    **chunk,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {field: text},
                            "finish_reason": None,
                            "logprobs": ctx.responses.chat_logprobs(lps) if lp is not None and i == 0 else None,
                        }
                    ],
                }
                for i, (field, text) in enumerate(parts)
            ]

        def on_text(piece, lps) -> list[dict]:
            return piece_chunks(splitter.feed(piece.text) if splitter else [("content", piece.text)], lps)

        def on_done(r) -> list[dict]:
            held = piece_chunks(splitter.finish(), []) if splitter else []
            return held + _stream_end(
                chunk, [{"index": 0, "delta": {}, "finish_reason": r.finish_reason}], r, usage_chunk
            )

        return ctx.stream(
            job,
            request,
            on_text,
            on_done,
            head={  # llama-server's first chunk: the role, content null
                **chunk,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}],
            },
        )
    r = await ctx.collect(job, request)
    message, finish = _message(r, tools, think)
    return {
        **base,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "logprobs": ctx.responses.chat_logprobs(r.logprobs) if lp is not None else None,
            }
        ],
        "usage": usage(r),
        "timings": timings(r.stats),
    }


def _message(r, tools: list[dict], think: bool | None = None) -> tuple[dict, str]:
    """The assistant message of a finished reply, and its finish reason (tool_calls for calls).
    `think`: None leaves the text whole; else whether the prompt opened a think block."""
    thought, text = reasoning.split(r.text, think) if think is not None else (None, r.text)
    head = {"role": "assistant"} | ({"reasoning_content": thought} if thought is not None else {})
    if not tools:
        return head | {"content": text}, r.finish_reason
    content, calls = tool_calls.parse(text, tools)
    if not calls:
        return head | {"content": content}, r.finish_reason
    return head | {"content": content, "tool_calls": [c.as_openai() for c in calls]}, "tool_calls"


def _include_usage(req) -> bool:
    opts = (req.model_extra or {}).get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def _stream_end(chunk: dict, choices: list[dict], r, usage_chunk: bool) -> list[dict]:
    """The finishing chunk, with usage and timings; with include_usage they come in a chunk of
    their own after it (choices [])."""
    totals = {"usage": usage(r), "timings": timings(r.stats)}
    if usage_chunk:
        return [{**chunk, "choices": choices}, {**chunk, "choices": [], **totals}]
    return [{**chunk, "choices": choices, **totals}]


def _tool_stream_end(chunk: dict, r, tools: list[dict], usage_chunk: bool, think: bool | None) -> list[dict]:
    message, finish = _message(r, tools, think)
    delta: dict = {k: message[k] for k in ("reasoning_content",) if k in message}
    if message.get("content"):
        delta["content"] = message["content"]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    frames = [{**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}] if delta else []
    return frames + _stream_end(chunk, [{"index": 0, "delta": {}, "finish_reason": finish}], r, usage_chunk)


@router.post("/v1/completions")
async def completions(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, CompletionRequest)
    lp = req.logprobs
    job = ctx.requests.job(req, await asyncio.to_thread(ctx.requests.text_prompt, req.prompt), lp)
    base = {
        "id": f"cmpl-{uuid.uuid4().hex[:24]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": ctx.model_id,
        "system_fingerprint": ctx.fingerprint,
    }
    if req.stream:
        sent = [0]  # characters streamed so far: text_offset continues across chunks

        def chunk(piece: TextPiece, lps: list) -> dict:
            out = ctx.responses.legacy_logprobs(lps, sent[0]) if lp is not None else None
            sent[0] += len(piece.text)
            return {**base, "choices": [{"index": 0, "text": piece.text, "finish_reason": None, "logprobs": out}]}

        return ctx.stream(
            job,
            request,
            chunk,
            lambda r: _stream_end(
                base,
                [{"index": 0, "text": "", "finish_reason": r.finish_reason, "logprobs": None}],
                r,
                _include_usage(req),
            ),
        )
    r = await ctx.collect(job, request)
    return {
        **base,
        "choices": [
            {
                "index": 0,
                "text": r.text,
                "finish_reason": r.finish_reason,
                "logprobs": ctx.responses.legacy_logprobs(r.logprobs) if lp is not None else None,
            }
        ],
        "usage": usage(r),
        "timings": timings(r.stats),
    }

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
from dataclasses import replace

from fastapi import APIRouter, Request

from ..engine.text import TextPiece
from . import reasoning, tool_calls, tool_stream
from .context import ctx_of
from .http import ApiError
from .responses import generation_settings, timings, usage
from .schemas import ChatRequest, CompletionRequest

router = APIRouter()


@router.get("/v1/models")
@router.get("/models")
async def models(request: Request):
    ctx = ctx_of(request)
    return {
        "object": "list",
        "data": [
            {
                "id": ctx.model_id,
                "aliases": ctx.aliases,  # llama-server's --alias names and --tags
                "tags": ctx.tags,
                "object": "model",
                "created": ctx.created,
                "owned_by": "mlxcel-py",
                "meta": ctx.model_meta,  # llama-server's: n_vocab, n_ctx, n_ctx_train, n_embd, n_params, size
                "capabilities": ["completion", "multimodal"] if ctx.vision is not None else ["completion"],
            }
        ],
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
    prompt = await asyncio.to_thread(ctx.requests.chat_prompt, req.messages, req.tools, ctx.requests.rendering(req))
    jobs = await _choice_jobs(ctx, req, [prompt], lp, grammar=grammar)
    # reasoning_format (llama-server): <think>...</think> into reasoning_content unless "none"
    fmt = (req.model_extra or {}).get("reasoning_format", ctx.reasoning_format)
    if fmt not in reasoning.FORMATS:
        raise ApiError(f"'reasoning_format' must be one of {', '.join(reasoning.FORMATS)}")
    think = None if fmt == "none" else reasoning.opened_by(ctx.tokenizer.decode(prompt[-8:]))
    if think and any(j.grammar is not None for j in jobs):
        # a template that opens <think> (DeepSeek R1, Qwen3) before a reply under a grammar (a
        # required call, structured output): the grammar's text is the reply, never a thought
        think = False
    reply = _ChatReply(ctx, req, lp, think, legacy=fmt == "deepseek-legacy")
    if req.stream and len(jobs) > 1:
        if tools:
            raise ApiError("'n' above 1 with 'tools' is served without 'stream'")
        return reply.stream_choices(jobs, request)
    if req.stream and tools:
        return reply.stream_tool_calls(jobs[0], request, tools)
    if req.stream:
        return reply.stream_text(jobs[0], request)
    results = await ctx.collect_many(jobs, request)
    return reply.whole(results, tools, jobs[0], prompt)


class _ChatReply:
    """One chat request's answer in OpenAI's shapes: a stream of chunks (its `n` choices side by
    side, a reply that may hold tool calls, or plain text with reasoning split out), or the whole
    completion."""

    def __init__(self, ctx, req: ChatRequest, lp: int | None, think: bool | None, *, legacy: bool):
        self.ctx, self.req, self.lp, self.think = ctx, req, lp, think
        self.legacy = legacy  # the thought split out, and the text kept whole in content
        self.base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": ctx.model_id,
            "system_fingerprint": ctx.fingerprint,
        }
        # stream_options.include_usage (OpenAI): usage and timings in a last chunk of their own, choices []
        self.usage_chunk = _include_usage(req)
        self.chunk = {**self.base, "object": "chat.completion.chunk"}

    def progress_chunk(self, p: dict) -> dict:  # return_progress: a chunk per prompt chunk fed
        return {**self.chunk, "choices": [], "prompt_progress": p}

    def head(self, i: int) -> dict:  # llama-server's first chunk: the role, content null
        return {
            **self.chunk,
            "choices": [{"index": i, "delta": {"role": "assistant", "content": None}, "finish_reason": None}],
        }

    def frame(self, delta: dict, i: int = 0) -> dict:
        return {**self.chunk, "choices": [{"index": i, "delta": delta, "finish_reason": None}]}

    def splitter(self) -> reasoning.ReasoningSplit | None:
        return reasoning.ReasoningSplit(self.think) if self.think is not None else None

    def stream_choices(self, jobs: list, request: Request):
        """`n` choices streamed side by side, each with its own reasoning split."""
        splitters = [self.splitter() for _ in jobs]

        def parts(i: int, text: str) -> list[tuple[str, str]]:
            return splitters[i].feed(text) if splitters[i] else [("content", text)]

        def done(i: int, r) -> list[dict]:
            held = splitters[i].finish() if splitters[i] else []
            end = {**self.chunk, "choices": [{"index": i, "delta": {}, "finish_reason": r.finish_reason}]}
            return [self.frame({f: t}, i) for f, t in held] + [end]

        def totals(results: list) -> list[dict]:
            if not self.usage_chunk:
                return []
            return [{**self.chunk, "choices": [], "usage": _usage_of(results), "timings": timings(results[0].stats)}]

        return self.ctx.stream_many(
            jobs,
            request,
            lambda i, piece, lps: [self.frame({f: t}, i) for f, t in parts(i, piece.text)],
            done,
            totals,
            head=[self.head(i) for i in range(len(jobs))],
        )

    def stream_tool_calls(self, job, request: Request, tools: list[dict]):
        """The thought and text that cannot be a call stream as they come; a call goes out, in
        OpenAI's pieces (id and name, then argument fragments), once the reply is parsed whole;
        under a grammar (a required or named call, the generic format) calls go out as decoded."""
        calls_out = tool_stream.ToolStream(tools, live_args=job.grammar is not None)
        split = self.splitter()
        called = [False]

        def tool_deltas(parts: list[tuple[str, str]]) -> list[dict]:
            out = []
            for field, text in parts:
                if field == "reasoning_content":
                    out.append(self.frame({field: text}))
                    continue
                content, entries = calls_out.feed(text)
                if content:
                    out.append(self.frame({"content": content}))
                called[0] = called[0] or bool(entries)
                out += [self.frame({"tool_calls": [e]}) for e in entries]
            return out

        def tool_done(r) -> list[dict]:
            frames = tool_deltas(split.finish()) if split else []
            content, calls, entries = calls_out.finish()
            frames += [self.frame({"content": content})] if content else []
            frames += [self.frame({"tool_calls": [e]}) for e in entries]
            finish = "tool_calls" if (calls or called[0]) and r.finish_reason != "length" else r.finish_reason
            end = [{"index": 0, "delta": {}, "finish_reason": finish}]
            return frames + _stream_end(self.chunk, end, r, self.usage_chunk)

        return self.ctx.stream(
            job,
            request,
            lambda piece, lps: tool_deltas(split.feed(piece.text) if split else [("content", piece.text)]),
            tool_done,
            head=self.head(0),
            on_progress=self.progress_chunk,
        )

    def stream_text(self, job, request: Request):
        """One choice's text, its thought split out (and, deepseek-legacy, kept whole in content too)."""
        splitter = self.splitter()
        logprobs = self.ctx.responses.chat_logprobs if self.lp is not None else None

        def piece_chunks(parts: list[tuple[str, str]], lps: list) -> list[dict]:
            return [
                {
                    **self.chunk,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {field: text},
                            "finish_reason": None,
                            "logprobs": logprobs(lps) if logprobs is not None and i == 0 else None,
                        }
                    ],
                }
                for i, (field, text) in enumerate(parts)
            ]

        def thought(parts: list[tuple[str, str]], raw: str) -> list[tuple[str, str]]:
            if not self.legacy:
                return parts
            return [p for p in parts if p[0] == "reasoning_content"] + ([("content", raw)] if raw else [])

        def on_text(piece, lps) -> list[dict]:
            return piece_chunks(
                thought(splitter.feed(piece.text), piece.text) if splitter else [("content", piece.text)], lps
            )

        def on_done(r) -> list[dict]:
            held = piece_chunks(thought(splitter.finish(), ""), []) if splitter else []
            end = [{"index": 0, "delta": {}, "finish_reason": r.finish_reason}]
            return held + _stream_end(self.chunk, end, r, self.usage_chunk)

        return self.ctx.stream(job, request, on_text, on_done, head=self.head(0), on_progress=self.progress_chunk)

    def whole(self, results: list, tools: list[dict], job, prompt: list[int]) -> dict:
        """The completion, every choice at once (llama-server's `__verbose` with -v)."""
        ctx = self.ctx
        choices = []
        for i, r in enumerate(results):
            message, finish = _message(r, tools, self.think, self.legacy)
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": ctx.responses.chat_logprobs(r.logprobs) if self.lp is not None else None,
                }
            )
        out = {
            **self.base,
            "object": "chat.completion",
            "choices": choices,
            "usage": _usage_of(results),
            "timings": timings(results[0].stats),
        }
        if ctx.verbose or (self.req.model_extra or {}).get("verbose") is True:  # llama-server's -v: what was decoded
            out["__verbose"] = {
                "prompt": ctx.tokenizer.decode(prompt),
                "content": results[0].text,
                "tokens_evaluated": len(prompt),
                "generation_settings": generation_settings(job, eog=ctx.engine.eos_ids),
            }
        return out


@router.post("/v1/chat/completions/input_tokens")
@router.post("/chat/completions/input_tokens")
async def chat_input_tokens(request: Request):
    """llama-server's token count of a chat request: the prompt `/v1/chat/completions` would decode."""
    _, prompt = await _rendered(request)
    return {"input_tokens": len(prompt)}


async def _rendered(request: Request) -> tuple:
    """(ctx, the prompt ids) of a chat request, checked and rendered as the chat route does."""
    ctx = ctx_of(request)
    await ctx.wake()
    req = await ctx.requests.parse(request, ChatRequest)
    ctx.requests.tools(req)  # the same checks of tools and tool_choice
    rendering = ctx.requests.rendering(req)
    return ctx, await asyncio.to_thread(ctx.requests.chat_prompt, req.messages, req.tools, rendering)


@router.post("/apply-template")
async def apply_template(request: Request):
    """llama-server's `/apply-template`: the chat prompt as text, without decoding it."""
    ctx, prompt = await _rendered(request)
    return {"prompt": ctx.tokenizer.decode(prompt)}


def _message(r, tools: list[dict], think: bool | None = None, legacy: bool = False) -> tuple[dict, str]:
    """The assistant message of a finished reply, and its finish reason (tool_calls for calls).
    `think`: None leaves the text whole; else whether the prompt opened a think block. `legacy`
    (deepseek-legacy): the thought split out, and the content the whole text, tags included."""
    thought, text = reasoning.split(r.text, think) if think is not None else (None, r.text)
    if legacy:
        text = r.text
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


async def _choice_jobs(ctx, req, prompts: list[list[int]], lp, grammar=None) -> list:
    """A job per prompt and choice (`n`): prompt-major, as OpenAI numbers a batch's choices. A
    request's seed gives choice k the seed + k, so the choices differ and each is reproducible."""
    jobs = []
    for p in prompts:
        for k in range(req.n):
            job = await ctx.requests.job(req, p, lp, grammar=grammar)
            if k and job.sampling.seed is not None:
                job.sampling = replace(job.sampling, seed=job.sampling.seed + k)
            jobs.append(job)
    return jobs


def _usage_of(results: list, n_prompts: int = 1) -> dict:
    """One usage for a request's choices: each prompt counted once, every completion summed."""
    if len(results) == 1:
        return usage(results[0])
    per = len(results) // n_prompts  # choices per prompt (jobs are prompt-major)
    firsts = [usage(results[i * per]) for i in range(n_prompts)]
    prompt_tokens = sum(u["prompt_tokens"] for u in firsts)
    completion = sum(r.stats.generated_tokens for r in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in firsts)},
    }


@router.post("/v1/completions")
async def completions(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, CompletionRequest)
    lp = req.logprobs
    prompts = await asyncio.to_thread(ctx.requests.prompts, req.prompt)
    jobs = await _choice_jobs(ctx, req, prompts, lp)
    base = {
        "id": f"cmpl-{uuid.uuid4().hex[:24]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": ctx.model_id,
        "system_fingerprint": ctx.fingerprint,
    }
    if req.stream:
        sent = [0] * len(jobs)  # characters streamed so far: text_offset continues across chunks

        def chunk(i: int, piece: TextPiece, lps: list) -> dict:
            out = ctx.responses.legacy_logprobs(lps, sent[i]) if lp is not None else None
            sent[i] += len(piece.text)
            return {**base, "choices": [{"index": i, "text": piece.text, "finish_reason": None, "logprobs": out}]}

        def finish(i: int, r) -> dict:
            return {"index": i, "text": "", "finish_reason": r.finish_reason, "logprobs": None}

        if len(jobs) == 1:
            return ctx.stream(
                jobs[0],
                request,
                lambda piece, lps: chunk(0, piece, lps),
                lambda r: _stream_end(base, [finish(0, r)], r, _include_usage(req)),
                on_progress=lambda p: {**base, "choices": [], "prompt_progress": p},
            )
        return ctx.stream_many(
            jobs,
            request,
            lambda i, piece, lps: [chunk(i, piece, lps)],
            lambda i, r: [{**base, "choices": [finish(i, r)]}],
            lambda results: (
                [{**base, "choices": [], "usage": _usage_of(results, len(prompts))}] if _include_usage(req) else []
            ),
        )
    results = await ctx.collect_many(jobs, request)
    return {
        **base,
        "choices": [
            {
                "index": i,
                "text": r.text,
                "finish_reason": r.finish_reason,
                "logprobs": ctx.responses.legacy_logprobs(r.logprobs) if lp is not None else None,
            }
            for i, r in enumerate(results)
        ],
        "usage": _usage_of(results, len(prompts)),
        "timings": timings(results[0].stats),
    }

"""llama-server's native routes: `/completion`, `/tokenize`, `/detokenize`, `/health`.

`/completion` streams bare JSON frames ending with the full object (no `[DONE]`), returns
`tokens` with `return_tokens` and `completion_probabilities` with `n_probs`; `/tokenize` gives
`{id, piece}` pairs with `with_pieces` (a piece that is part of a character comes back as its
bytes); `/health` answers 503 in llama-server's shape when the worker cannot take requests.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .context import LOADING, ServerContext, ctx_of
from .responses import timings
from .schemas import DetokenizeRequest, NativeCompletionRequest, TokenizeRequest
from .worker import Result

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    if request.app.state.ctx is None:
        return JSONResponse(LOADING, status_code=503)
    ctx = ctx_of(request)
    w = ctx.worker
    if not w.alive:
        why = f"warmup failed: {w.warmup_error}" if w.warmup_error else "the model worker stopped"
        return JSONResponse({"error": {"code": 503, "message": why, "type": "unavailable_error"}}, status_code=503)
    return {
        "status": "ok",
        "model": ctx.model_id,
        "slots_idle": w.parallel - w.active,
        "slots_processing": w.active,
        "batch": {
            "active_sequences": w.active,
            "queue_depth": w.queue_depth,
            "max_batch_size": w.parallel,
            "speculating": w.gate.open,
        },
        "context_size": ctx.engine.context_length,
    }


@router.get("/slots")
async def slots(request: Request):
    """llama-server's slot list: one entry per -np slot, what it is decoding."""
    ctx = ctx_of(request)
    w = ctx.worker
    out = []
    for i, slot in enumerate(list(w.slots)):
        gen = slot.gen if slot is not None else None
        job = slot.job if slot is not None else None
        out.append(
            {
                "id": i,
                "n_ctx": ctx.engine.context_length,
                "is_processing": slot is not None,
                "speculative": bool(w.speculative_allowed and ctx.engine.draft.enabled),
                "speculating_now": bool(
                    slot is not None and w.speculative_allowed and ctx.engine.draft.enabled and w.gate.open
                ),
                "n_prompt_tokens": len(job.prompt) if job is not None else 0,
                "n_cached_tokens": gen.stats.cached_tokens if gen is not None else 0,
                "next_token": {
                    "has_next_token": slot is not None,
                    "n_decoded": len(gen.tokens) if gen is not None else 0,
                    "n_remain": (job.max_tokens - len(gen.tokens)) if gen is not None else -1,
                },
            }
        )
    return out


@router.get("/metrics")
async def metrics(request: Request):
    from .metrics import CONTENT_TYPE

    ctx = ctx_of(request)
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)


@router.post("/tokenize")
async def tokenize(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, TokenizeRequest)
    ids = list(await asyncio.to_thread(ctx.tokenizer.encode, req.content, add_special_tokens=req.add_special))
    if not req.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": ctx.responses.piece(i)} for i in ids]}


@router.post("/detokenize")
async def detokenize(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, DetokenizeRequest)
    return {"content": ctx.tokenizer.decode(ctx.requests.token_ids(req.tokens, "tokens"))}


def _native(ctx: ServerContext, r: Result, prompt: str, n_eval: int, *, return_tokens: bool, probs: bool) -> dict:
    stop_type = {"length": "limit"}.get(r.finish_reason, "word" if r.stop_word else "eos")
    extra = {"completion_probabilities": ctx.responses.native_probs(r.logprobs)} if probs else {}
    return {
        **extra,
        "index": 0,
        "content": r.text,
        "tokens": list(r.tokens) if return_tokens else [],
        "id_slot": 0,
        "stop": True,
        "model": ctx.model_id,
        "tokens_predicted": r.stats.generated_tokens,
        "tokens_evaluated": n_eval,
        "generation_settings": {},
        "prompt": prompt,
        "has_new_line": "\n" in r.text,
        "truncated": False,
        "stop_type": stop_type,
        "stopping_word": r.stop_word or "",
        "tokens_cached": r.stats.cached_tokens,
        "timings": timings(r.stats),
    }


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, NativeCompletionRequest)
    prompt = await asyncio.to_thread(ctx.requests.text_prompt, req.prompt)
    lp = req.n_probs or None
    job = ctx.requests.job(req, prompt, lp)
    ptext = req.prompt if isinstance(req.prompt, str) else ""
    probs = lp is not None
    if req.stream:
        # the native stream ends with the full object and has no [DONE] sentinel
        return ctx.stream(
            job,
            request,
            lambda piece, lps: {
                "index": 0,
                "content": piece.text,
                "tokens": [],
                "stop": False,
                "id_slot": 0,
                "tokens_predicted": piece.tokens,
                "tokens_evaluated": len(prompt),
                **({"completion_probabilities": ctx.responses.native_probs(lps)} if probs else {}),
            },
            lambda r: {
                **_native(ctx, r, ptext, len(prompt), return_tokens=req.return_tokens, probs=False),
                "content": "",
            },
            done_sentinel=False,
        )
    r = await ctx.collect(job, request)
    return _native(ctx, r, ptext, len(prompt), return_tokens=req.return_tokens, probs=probs)

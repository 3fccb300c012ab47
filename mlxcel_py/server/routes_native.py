"""llama-server's native routes: `/completion`, `/infill`, `/tokenize`, `/detokenize`, `/health`.

`/completion` streams bare JSON frames ending with the full object (no `[DONE]`), returns
`tokens` with `return_tokens` and `completion_probabilities` with `n_probs`; `/tokenize` gives
`{id, piece}` pairs with `with_pieces` (a piece that is part of a character comes back as its
bytes); `/health` answers 503 in llama-server's shape when the worker cannot take requests.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..formats.prompting import leading_bos
from .context import LOADING, ServerContext, ctx_of
from .http import ApiError, parse_json, read_body
from .image_parts import image_data_ids, prompt_text
from .infill import check_extra, fim_tokens, infill_prompt, why_not
from .responses import generation_settings, timings
from .schemas import DetokenizeRequest, InfillRequest, NativeCompletionRequest, TokenizeRequest
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
    if not getattr(request.app.state, "slots", True):  # --no-slots: llama-server's answer
        return JSONResponse(
            {
                "error": {
                    "code": 501,
                    "message": "This server does not support slots endpoint. Start it with `--slots`",
                    "type": "not_supported_error",
                }
            },
            status_code=501,
        )
    ctx = ctx_of(request)
    w = ctx.worker
    out = []
    for i, slot in enumerate(list(w.slots)):
        gen = slot.gen if slot is not None else None
        job = slot.job if slot is not None else None
        cached = gen.stats.cached_tokens if gen is not None else 0
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
                # llama-server's field: the prompt as text (a request's, so /slots takes the key)
                "prompt": prompt_text(ctx.tokenizer, job.prompt, ctx.vision) if job is not None else "",
                "n_cached_tokens": cached,
                "n_prompt_tokens_cache": cached,  # llama-server's name for it
                "n_prompt_tokens_processed": (len(job.prompt) - cached) if job is not None else 0,
                # a list of one, as llama-server sends it
                "next_token": [
                    {
                        "has_next_token": slot is not None,
                        "has_new_line": slot is not None and "\n" in slot.stream.text,
                        "n_decoded": len(gen.tokens) if gen is not None else 0,
                        "n_remain": (job.max_tokens - len(gen.tokens)) if gen is not None else -1,
                    }
                ],
            }
        )
    return out


@router.get("/metrics")
async def metrics(request: Request):
    from .metrics import CONTENT_TYPE

    ctx = ctx_of(request)
    if not ctx.metrics_endpoint:  # llama-server's answer, word for word
        raise ApiError(
            "This server does not support metrics endpoint. Start it with `--metrics`",
            status=501,
            type="not_supported_error",
        )
    response = Response(ctx.metrics.render(), media_type=CONTENT_TYPE)
    # spelled as llama-server spells it: HTTP names are case-blind, but its scrapers and test
    # suite look this one up by exact case (Starlette would send it lowercased)
    response.raw_headers.append((b"Process-Start-Time-Unix", str(ctx.metrics.started).encode()))
    return response


@router.get("/lora-adapters")
async def lora_adapters(request: Request):
    """llama-server's adapter list: every --lora/--lora-scaled/--adapter-path adapter at the scales
    requests get when they name none."""
    ctx = ctx_of(request)
    return ctx.adapters.listing() if ctx.adapters is not None else []


@router.post("/lora-adapters")
async def set_lora_adapters(request: Request):
    """The scales every request gets from now on ([{"id", "scale"}]; an adapter not listed: 0).
    The fused model for them loads with the next request that needs it (adapter_variants)."""
    ctx = ctx_of(request)
    body = parse_json(await read_body(request, ctx.body_limit), array=True)
    scales = ctx.requests.adapter_scales(body)  # read as a request's own `lora` is
    if scales is not None:
        ctx.adapters.set_global(scales)
    return {"success": True}


@router.post("/tokenize")
async def tokenize(request: Request):
    ctx = ctx_of(request)
    await ctx.wake()
    req = await ctx.requests.parse(request, TokenizeRequest)
    ids = list(await asyncio.to_thread(ctx.tokenizer.encode, req.content, add_special_tokens=req.add_special))
    if not req.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": ctx.responses.piece(i)} for i in ids]}


@router.post("/detokenize")
async def detokenize(request: Request):
    ctx = ctx_of(request)
    await ctx.wake()
    req = await ctx.requests.parse(request, DetokenizeRequest)
    return {"content": ctx.tokenizer.decode(ctx.requests.token_ids(req.tokens, "tokens"))}


def _native(
    ctx: ServerContext, job, r: Result, prompt: str, *, return_tokens: bool, probs: bool, index: int = 0, stream=False
) -> dict:
    stop_type = {"length": "limit"}.get(r.finish_reason, "word" if r.stop_word else "eos")
    extra = {"completion_probabilities": ctx.responses.native_probs(r.logprobs, job.post_sampling)} if probs else {}
    return {
        **extra,
        "index": index,
        "content": r.text,
        "tokens": list(r.tokens) if return_tokens else [],
        "id_slot": 0,
        "stop": True,
        "model": ctx.model_id,
        "tokens_predicted": r.stats.generated_tokens,
        "tokens_evaluated": len(job.prompt),
        "generation_settings": generation_settings(
            job, n_probs=job.logprobs or 0, stream=stream, eog=ctx.engine.eos_ids
        ),
        "prompt": prompt,
        "has_new_line": "\n" in r.text,
        # llama-server's: the context window was shifted, or stopped the generation
        "truncated": r.stats.context_shifts > 0
        or (r.finish_reason == "length" and len(job.prompt) + r.stats.generated_tokens >= ctx.engine.context_length),
        "stop_type": stop_type,
        "stopping_word": r.stop_word or "",
        "tokens_cached": r.stats.cached_tokens,
        "timings": timings(r.stats),
    }


def _fields(obj: dict, wanted: list) -> dict:
    """llama-server's `response_fields`: only these keys, `a/b` reaching into a nested object."""
    out = {}
    for name in wanted:
        value: object = obj
        for key in name.split("/"):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[name] = value
    return out


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request):
    ctx = ctx_of(request)
    req = await ctx.requests.parse(request, NativeCompletionRequest)
    if (images := (req.model_extra or {}).get("image_data")) is not None:  # llama-server's older form
        ctx.requests.fits(len(req.prompt) if isinstance(req.prompt, str) else 0)
        prompts = [await asyncio.to_thread(image_data_ids, ctx.vision, req.prompt, images)]
    else:
        prompts = await asyncio.to_thread(ctx.requests.prompts, req.prompt)
    return await _complete(ctx, request, req, prompts)


@router.post("/infill")
async def infill(request: Request):
    """llama-server's fill-in-the-middle (infill.py builds the prompt); answered as /completion."""
    ctx = ctx_of(request)
    fim = fim_tokens(ctx.tokenizer.get_vocab())
    refused = why_not(fim)
    if refused:
        raise ApiError(refused, status=501, type="not_supported_error")
    req = await ctx.requests.parse(request, InfillRequest)
    extra = check_extra(req.input_extra)

    def build() -> list[int]:
        ids = ctx.requests.mixed_ids
        tok = ctx.tokenizer
        return infill_prompt(
            fim,
            lambda text: list(tok.encode(text, add_special_tokens=False)),
            ids(req.input_prefix, "input_prefix"),
            ids(req.input_suffix, "input_suffix"),
            extra,
            ids(req.prompt, "prompt"),
            n_ctx=ctx.engine.context_length,
            n_predict=ctx.max_tokens,
            bos=leading_bos(tok),
        )

    prompt = await asyncio.to_thread(build)
    return await _complete(ctx, request, req, [prompt])


async def _complete(ctx: ServerContext, request: Request, req, prompts: list[list[int]]):
    """Decode each prompt and answer in llama-server's native shape (streamed or whole)."""
    lp = req.n_probs or None
    jobs = [await ctx.requests.job(req, p, lp) for p in prompts]
    texts = [prompt_text(ctx.tokenizer, p, ctx.vision) for p in prompts]  # llama-server echoes it decoded
    probs = lp is not None
    wanted = (req.model_extra or {}).get("response_fields")
    if wanted is not None and not (isinstance(wanted, list) and all(isinstance(w, str) for w in wanted)):
        raise ApiError("'response_fields' must be a list of field names")  # before any decoding

    def frame(i: int, piece) -> dict:
        return {
            "index": i,
            "content": piece.text,
            "tokens": list(piece.ids),
            "stop": False,
            "id_slot": 0,
            "tokens_predicted": piece.tokens,
            "tokens_evaluated": len(prompts[i]),
        }

    def last(i: int, r: Result) -> dict:
        end = _native(ctx, jobs[i], r, texts[i], return_tokens=req.return_tokens, probs=False, index=i, stream=True)
        return {**end, "content": ""}

    if req.stream and len(jobs) > 1:
        return ctx.stream_many(
            jobs,
            request,
            lambda i, piece, lps: [
                {
                    **frame(i, piece),
                    **(
                        {"completion_probabilities": ctx.responses.native_probs(lps, jobs[i].post_sampling)}
                        if probs
                        else {}
                    ),
                }
            ],
            lambda i, r: [last(i, r)],
            lambda results: [],
            done_sentinel=False,
        )
    if req.stream:
        # the native stream ends with the full object and has no [DONE] sentinel
        return ctx.stream(
            jobs[0],
            request,
            lambda piece, lps: {
                **frame(0, piece),
                **(
                    {"completion_probabilities": ctx.responses.native_probs(lps, jobs[0].post_sampling)}
                    if probs
                    else {}
                ),
            },
            lambda r: last(0, r),
            done_sentinel=False,
            on_progress=lambda p: {"index": 0, "content": "", "tokens": [], "stop": False, "prompt_progress": p},
        )
    results = await ctx.collect_many(jobs, request)
    out = [
        _native(ctx, job, r, text, return_tokens=req.return_tokens, probs=probs, index=i)
        for i, (job, r, text) in enumerate(zip(jobs, results, texts))
    ]
    if wanted:
        out = [_fields(o, wanted) for o in out]
    return out[0] if len(out) == 1 else out

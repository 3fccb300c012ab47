"""Embeddings, as llama-server serves them under `--embeddings`: OpenAI's `POST /v1/embeddings`
(`input`: a string, token ids, ids and text mixed, or a list of these; `encoding_format` float or
base64; `usage`) and the native `POST /embedding` / `/embeddings` (`content` or `input`; a list of
`{index, embedding}` with every token's row under `--pooling none`). The vectors come from
engine/embeddings.py on the model's thread (Worker.call); without `--embeddings` both answer 501,
and `--pooling none` is refused on the OpenAI route, in llama-server's words."""

from __future__ import annotations

import asyncio
import base64
import struct

from fastapi import APIRouter, Request

from ..engine.embeddings import embed
from .context import ServerContext, ctx_of
from .http import ApiError, read_json

router = APIRouter()


@router.post("/v1/embeddings")
async def openai_embeddings(request: Request):
    return await _embeddings(request, openai=True)


@router.post("/embedding")
@router.post("/embeddings")
async def native_embeddings(request: Request):
    return await _embeddings(request, openai=False)


async def _embeddings(request: Request, openai: bool):
    ctx = ctx_of(request)
    if not ctx.embeddings and ctx.reranking:  # llama-server's rank pooling refuses embeddings so
        raise ApiError("This server reranks (--reranking); start it with --embeddings too to serve embeddings")
    ctx.serves(ctx.embeddings, "embeddings", "--embeddings")
    if openai and ctx.pooling == "none":
        raise ApiError("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    body = await read_json(request, ctx.body_limit)
    if "input" in body:
        value = body["input"]
    elif "content" in body:
        value, openai = body["content"], False  # llama-server: "content" is not OpenAI's, so the native shape
    else:
        raise ApiError('"input" or "content" must be provided')
    b64 = body.get("encoding_format", "float")
    if b64 not in ("float", "base64"):
        raise ApiError("The format to return the embeddings in. Can be either float or base64")
    normalize = body.get("embd_normalize", 2)
    if isinstance(normalize, bool) or not isinstance(normalize, int) or not -1 <= normalize <= 64:
        raise ApiError(
            "'embd_normalize' must be an integer: -1 none, 0 int16 range, 2 euclidean, p a p-norm (up to 64)"
        )
    prompts = await asyncio.to_thread(_prompts, ctx, value)
    engine, pooling = ctx.engine, ctx.pooling
    # the model is read on the worker's thread: after a sleep (--sleep-idle-seconds) it is loaded again first
    vectors = await ctx.worker.call(
        ctx.metrics.prompts_fed(prompts, lambda p: embed(engine.model, p, pooling, normalize))
    )
    if not openai:
        return [{"index": i, "embedding": v} for i, v in enumerate(vectors)]
    n = sum(len(p) for p in prompts)
    return {
        "model": body.get("model") or ctx.model_id,
        "object": "list",
        "usage": {"prompt_tokens": n, "total_tokens": n},
        "data": [_item(i, v[0], b64 == "base64") for i, v in enumerate(vectors)],
    }


def _prompts(ctx: ServerContext, value) -> list[list[int]]:
    """The request's prompts as token ids (each with the BOS the vocabulary adds), every one
    non-empty and within the window."""
    parts = value if isinstance(value, list) else [value]
    if value == "" or value == [] or any(p == "" or p == [] for p in parts):
        raise ApiError("Input content cannot be empty")
    prompts = ctx.requests.prompts(value)
    for p in prompts:
        if not p:
            raise ApiError("Input content cannot be empty")
        if len(p) > ctx.engine.context_length:
            raise ApiError(
                f"input ({len(p)} tokens) is too large to process: the context window is "
                f"{ctx.engine.context_length} tokens",
                type="exceed_context_size_error",
            )
    return prompts


def _item(i: int, vector: list[float], b64: bool) -> dict:
    if not b64:
        return {"embedding": vector, "index": i, "object": "embedding"}
    packed = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return {"embedding": packed, "index": i, "object": "embedding", "encoding_format": "base64"}

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
from typing import Any

from fastapi import APIRouter, Request
from pydantic import TypeAdapter, ValidationError

from ..engine.embeddings import embed
from .context import ServerContext, ctx_of
from .http import ApiError, read_json
from .requests import MAX_PROMPTS
from .schemas.common import PromptField

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


ENTRY_FORMS = (
    '"input" elements must be a string, a list of tokens, a list of mixed strings and tokens, '
    'a {"prompt_string": ...} object or a {"content": [parts]} object'
)


def _prompts(ctx: ServerContext, value) -> list[list[int]]:
    """The request's prompts as token ids (each with the BOS the vocabulary adds), every one
    non-empty and within the window. llama-server's forms: a prompt (a string, token ids, ids
    and strings mixed, a `prompt_string` object, an OpenAI `content` array of text parts) or a
    list of them; anything else is a 400, never embedded as whatever it stringifies to."""
    if value == []:
        raise ApiError('"input" must not be empty')
    several = isinstance(value, list) and not any(isinstance(p, (int, float)) for p in value)
    if several and len(value) > MAX_PROMPTS:
        raise ApiError(f"'input': at most {MAX_PROMPTS} prompts in one request, got {len(value)}")
    entries = [_entry(ctx, p) for p in value] if several else [_entry(ctx, value)]
    try:
        value = _PROMPTS.validate_python(entries if several else entries[0])
    except ValidationError:
        raise ApiError(ENTRY_FORMS) from None
    # an empty string is the vocabulary's BOS alone, as llama-server embeds it; nothing at all
    # (a vocabulary that adds none) is refused below
    bos = list(ctx.tokenizer.encode(""))
    prompts = [bos if p == "" else ctx.requests.one_prompt(p) for p in (value if several else [value])]
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


_PROMPTS = TypeAdapter(PromptField)


def _entry(ctx: ServerContext, p: Any) -> Any:
    """An OpenAI `{"content": [parts]}` entry as its text (llama-server joins the text parts);
    media parts are refused, as on a text model llama-server refuses them."""
    if not isinstance(p, dict) or "content" not in p:
        return p
    content = p["content"]
    if not isinstance(content, list):
        raise ApiError('"content" must be an array of parts')
    text = ""
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            text += part["text"]
        elif kind in ("image_url", "input_audio", "input_video", "video_url"):
            what = {"image_url": "image"}.get(kind, "audio" if kind == "input_audio" else "video")
            raise ApiError(f"{what} input is not supported for embeddings here; send its text")
        else:
            raise ApiError("unsupported content[].type")
    return text


def _item(i: int, vector: list[float], b64: bool) -> dict:
    if not b64:
        return {"embedding": vector, "index": i, "object": "embedding"}
    packed = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return {"embedding": packed, "index": i, "object": "embedding", "encoding_format": "base64"}

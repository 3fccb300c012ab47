"""Reranking, as llama-server serves it under `--reranking` (or `--pooling rank`): `POST /rerank`,
`/reranking`, `/v1/rerank` and `/v1/reranking` take a `query` and `documents` (Jina's and
llama-server's shape: strings, or objects with a `text`) or `texts` (Hugging Face TEI's), score
every document with the causal-LM path (engine/rerank.py: the model's next-token odds of "yes"
against "no" after the judge prompt, formats/rerank.py), and answer best first:

- `documents`: `{"model", "object": "list", "usage", "results": [{"index", "relevance_score"}]}`,
  each result with `document: {"text"}` when `return_documents` is true;
- `texts`: a list of `{"index", "score"}`, with `text` when `return_text` is true.

`top_n` keeps the best n. `instruction` (Qwen3-Reranker's task line) replaces the judge prompt's
default one. Without the flag the routes answer 501, as llama-server's do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from ..engine.rerank import relevance
from ..formats import rerank as rerank_prompt
from .context import ServerContext, ctx_of
from .http import ApiError, read_json

router = APIRouter()
MAX_DOCUMENTS = 256  # documents in one request (each is one prompt through the model)


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank(request: Request):
    ctx = ctx_of(request)
    ctx.serves(ctx.reranking, "reranking", "--reranking")
    body = await read_json(request, ctx.body_limit)
    query, documents, tei = _read(body)
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ApiError("'top_n' must be a positive integer")
    instruction = body.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise ApiError("'instruction' must be a string")
    prompts, (yes, no) = await asyncio.to_thread(_prompts, ctx, query, documents, instruction)
    engine = ctx.engine  # its model is read on the worker's thread (loaded again there after a sleep)
    scores = await ctx.worker.call(ctx.metrics.prompts_fed(prompts, lambda p: relevance(engine.model, p, yes, no)))
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
    if tei:
        with_text = body.get("return_text") is True
        return [{"index": i, "score": scores[i], **({"text": documents[i]} if with_text else {})} for i in order]
    with_docs = body.get("return_documents") is True
    n = sum(len(p) for p in prompts)
    return {
        "model": body.get("model") or ctx.model_id,
        "object": "list",
        "usage": {"prompt_tokens": n, "total_tokens": n},
        "results": [
            {"index": i, "relevance_score": scores[i], **({"document": {"text": documents[i]}} if with_docs else {})}
            for i in order
        ],
    }


def _read(body: dict) -> tuple[str, list[str], bool]:
    """(query, the documents' texts, whether they came as TEI's `texts`)."""
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise ApiError("'query' must be a non-empty string")
    tei = "texts" in body and "documents" not in body
    docs = body.get("texts") if tei else body.get("documents")
    field = "texts" if tei else "documents"
    if not isinstance(docs, list) or not docs:
        raise ApiError(f"'{field}' must be a non-empty array of strings")
    if len(docs) > MAX_DOCUMENTS:
        raise ApiError(f"'{field}': at most {MAX_DOCUMENTS} documents in one request, got {len(docs)}")
    texts = []
    for i, d in enumerate(docs):
        if isinstance(d, dict) and isinstance(d.get("text"), str):
            d = d["text"]
        if not isinstance(d, str):
            raise ApiError(f"'{field}[{i}]' must be a string (or an object with a 'text' string)")
        texts.append(d)
    return query, texts, tei


def _prompts(ctx: ServerContext, query: str, documents: list[str], instruction: str | None):
    """Every pair's prompt as token ids, each within the window, and the ids of the two answers."""
    tok = ctx.tokenizer
    template = rerank_prompt.template_of(tok)
    out = []
    for doc in documents:
        text = rerank_prompt.prompt(query, doc, template, instruction)
        ctx.requests.fits(len(text))
        ids = list(tok.encode(text, add_special_tokens=False))  # as llama-server: the template says it all
        if len(ids) > ctx.engine.context_length:
            raise ApiError(
                f"a document's prompt ({len(ids)} tokens) is too large to process: the context window is "
                f"{ctx.engine.context_length} tokens",
                type="exceed_context_size_error",
            )
        out.append(ids)
    return out, (_answer_id(tok, "yes"), _answer_id(tok, "no"))


def _answer_id(tokenizer: Any, word: str) -> int:
    """The token the model starts an answer `word` with: the vocabulary's own entry for it where
    there is one (Qwen3-Reranker reads "yes" and "no" so), else the first token of its encoding."""
    try:
        found = tokenizer.convert_tokens_to_ids(word)
    except Exception:
        found = None
    if isinstance(found, int) and found >= 0 and found != getattr(tokenizer, "unk_token_id", None):
        return found
    ids = list(tokenizer.encode(word, add_special_tokens=False))
    if not ids:
        raise ApiError(f"the model's vocabulary cannot spell {word!r}, which a reranker answers", status=500)
    return ids[0]

"""Embeddings of a prompt (serve's `/v1/embeddings`, llama-server's `--embeddings`): the model's
last hidden states (its final norm's output, models.taps.hidden_tap), pooled and normalized as
llama.cpp does it.

The prompt is fed through a fresh SequenceCache in the usual prefill chunks with the tap's rows
kept (`keep_hidden`), so the forward is the one generation runs and nothing is decoded. Pooling:
`none` (every token's row, not normalized), `mean`, `cls` (the first token's row), `last` (the
last token's, what decoder embedding models such as Qwen3-Embedding read). Normalization
(llama.cpp's `embd_normalize`): -1 none, 0 scaled so the largest magnitude is 32760 (an int16
range), 2 euclidean (the default), any other p a p-norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ..options import POOLINGS


def embed(model: Any, ids: Sequence[int], pooling: str, normalize: int = 2, channel: Any = None) -> list[list[float]]:
    """One vector (pooled) or one per token (`none`) for the prompt `ids`."""
    from ..models.taps import hidden_tap
    from .cache import SequenceCache

    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}")
    cache = SequenceCache(model, channel)
    cache.keep_hidden(hidden_tap(model))
    cache.prefill(list(ids))
    rows = cache.hidden_rows(0, len(ids)).astype(mx.float32)  # (tokens, hidden)
    if pooling == "none":
        return rows.tolist()
    pooled = {"mean": lambda: rows.mean(axis=0), "cls": lambda: rows[0], "last": lambda: rows[-1]}[pooling]()
    return [_normalized(pooled, normalize).tolist()]


def _normalized(v: mx.array, p: int) -> mx.array:
    if p == -1:
        return v
    if p == 0:
        size = mx.abs(v).max() / 32760.0
    elif p == 2:
        size = mx.sqrt((v * v).sum())
    else:
        size = (mx.abs(v) ** p).sum() ** (1.0 / p)
    return mx.where(size > 0, v / mx.maximum(size, 1e-30), mx.zeros_like(v))

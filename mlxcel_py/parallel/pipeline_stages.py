"""Pipeline stages for llama-style models, which mlx-lm's `PipelineMixin` does not cover.

mlx-lm splits a model's layers across ranks only for the architectures whose inner model mixes
in `PipelineMixin` (qwen2, qwen3_moe, qwen3_5, deepseek...). Llama, and so the default model,
has none. This gives such a model the same stages, in mlx-lm's order and with its messages:
rank r runs the layers after those of ranks r+1..size-1 (rank 0 the last ones, so it computes
the logits), receives the hidden states from rank r+1, sends its own to rank r-1, and an
all-gather hands rank 0's final hidden states to every rank. The outer model's `layers` becomes
the local layers, so `make_prompt_cache` builds caches for them only.

Only full-attention stacks whose inner `__call__` is embed -> layers(h, mask, cache) -> norm
qualify (`supports`): the forward below is that function with the stage messages added.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask

from ..models.families import family

_STAGED: dict[type, type] = {}


def supports(model: Any) -> bool:
    inner = getattr(model, "model", None)
    kind = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", None)
    if not family(kind).pipeline_stages or inner is None or hasattr(inner, "pipeline"):
        return False
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm")):
        return False
    return not any(getattr(layer, "use_sliding", False) for layer in inner.layers)


def _stage_call(self, inputs: mx.array, cache=None, input_embeddings: mx.array | None = None):
    h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
    local = self.layers[self.start_idx : self.end_idx]
    if cache is None:
        cache = [None] * len(local)
    mask = create_attention_mask(h, cache[0])
    rank, size, group = self.pipeline_rank, self.pipeline_size, self.pipeline_group
    if rank < size - 1:  # the earlier layers ran on rank + 1
        h = mx.distributed.recv_like(h, rank + 1, group=group)
    for layer, c in zip(local, cache):
        h = layer(h, mask, cache=c)
    if rank != 0:
        h = mx.distributed.send(h, rank - 1, group=group)
        if cache[-1] is not None:  # keep the send in the graph of anything that reads the cache
            cache[-1].keys = mx.depends(cache[-1].keys, h)
    h = mx.distributed.all_gather(h, group=group)[: h.shape[0]]  # rank 0's rows come first
    return self.norm(h)


def _local_layers(self):
    return self.model.layers[self.model.start_idx : self.model.end_idx]


def _staged(cls: type, attrs: dict) -> type:
    if cls not in _STAGED:
        # same module as the base: cpu_kernels finds the attention function there by name
        _STAGED[cls] = type(f"Staged{cls.__name__}", (cls,), {**attrs, "__module__": cls.__module__})
    return _STAGED[cls]


def split(model: Any, group: Any) -> None:
    """Keep this rank's layers of `model` (weights still lazy are never read for the others)."""
    inner = model.model
    rank, size = group.rank(), group.size()
    n = len(inner.layers)
    base, extra = divmod(n, size)
    counts = [base + (1 if r < extra else 0) for r in range(size)]  # mlx-lm's even split
    inner.start_idx = sum(counts[rank + 1 :])
    inner.end_idx = inner.start_idx + counts[rank]
    inner.pipeline_rank, inner.pipeline_size, inner.pipeline_group = rank, size, group
    inner.layers = inner.layers[: inner.end_idx]
    inner.layers[: inner.start_idx] = [None] * inner.start_idx  # names stay layers.N for the weights
    inner.__class__ = _staged(type(inner), {"__call__": _stage_call})
    model.__class__ = _staged(type(model), {"layers": property(_local_layers)})

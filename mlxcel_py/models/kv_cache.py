"""The KV cache type a loaded model runs with (--cache-type-k / --cache-type-v), and its size.

Where the fused decoder layers carry the model (models.decoder_layers) its caches hold the chosen
types: `auto` is float16 there (half the bytes a long context reads every step), `f32` keeps
float32, `bf16` is bfloat16, `q8_0` and `q4_0` llama.cpp's 8- and 4-bit blocks (int8 and uint8
buffers whose rows carry their scales: q8_0 is a quarter of float32's bytes and a little more).
Elsewhere (sliding windows, hybrid and other families, vision decoders of those) mlx-lm's layer
code writes the caches. `auto` keeps float32 there, as the activations are; an explicit `f16` or
`bf16` makes every plain and sliding KV cache of the model round its rows to that type as they
come in (`cache_kinds.store_as`, applied by `store_caches` wherever the engine makes caches), and
the attention reads them as they are. That holds on every rank of a --tp-size/--pp-size run
too (parallel.mirror's followers make their caches the same way). q8_0 and q4_0 blocks are
written by the fused layers only: asked for there, the cache keeps f16 and `kv_note` says so in
one line. The reports name the type really in use.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from . import cache_kinds, decoder_layers

if TYPE_CHECKING:
    from .loading import LoadedModel

NAMES = {mx.float32: "f32", mx.float16: "f16", mx.bfloat16: "bf16", mx.int8: "q8_0", mx.uint8: "q4_0"}


def describe(loaded: LoadedModel, cache_types: tuple[str, str]) -> LoadedModel:
    """`loaded` with its cache type, bytes per token and (an explicit type it cannot take) a note."""
    layers = decoder_layers.fused_layers(loaded.model)
    if layers:
        k_type, v_type = layers[0].kv_dtypes
        per_token = sum(x.kv_heads * (row_bytes(x.head_dim, k_type) + row_bytes(x.head_dim, v_type)) for x in layers)
        given = [NAMES[t] for t in (k_type, v_type)]
        asked = [
            f"{flag} {t}"
            for flag, t, got in zip(("--cache-type-k", "--cache-type-v"), cache_types, given)
            if t in ("q8_0", "q4_0") and got != t
        ]
        note = (
            f"{' and '.join(asked)}: a head dim of {layers[0].head_dim} is not one q8_0 and q4_0 run at "
            f"({', '.join(map(str, decoder_layers.BLOCK_HEAD_DIMS))}); the cache keeps f16 there"
            if asked
            else None
        )
        return dataclasses.replace(
            loaded, kv_cache=f"{given[0]} keys, {given[1]} values", kv_bytes_per_token=per_token, kv_note=note
        )
    return _unfused(loaded, cache_types)


_STORED: dict[int, tuple[mx.Dtype, mx.Dtype]] = {}  # id(model) -> its mlx-lm-written caches' types


def _stored_type(name: str) -> mx.Dtype:
    """What mlx-lm's layer code keeps for a cache type name: auto and f32 float32, the block
    types (written by the fused layers only) float16, the others themselves."""
    dtype = decoder_layers.KV_DTYPES.get(name, mx.float32)
    return mx.float16 if dtype in cache_kinds.BLOCK_DTYPES else dtype


def _unfused(loaded: LoadedModel, cache_types: tuple[str, str]) -> LoadedModel:
    """A model whose layers run mlx-lm's code (a distributed rank's too): f16/bf16 rounded as
    written (`store_caches`), q8_0 and q4_0 as f16 with a note."""
    why = decoder_layers.why_not(loaded.model) or "its layers run mlx-lm's code"
    asked = [
        (flag, t) for flag, t in zip(("--cache-type-k", "--cache-type-v"), cache_types) if t not in ("auto", "f32")
    ]
    if not asked:
        return dataclasses.replace(
            loaded, kv_cache="f32 keys, f32 values", kv_bytes_per_token=_f32_bytes(loaded.config), kv_note=None
        )
    kept = tuple(_stored_type(t) for t in cache_types)
    blocks = [f"{flag} {t}" for flag, t in asked if decoder_layers.KV_DTYPES[t] in cache_kinds.BLOCK_DTYPES]
    note = (
        f"{' and '.join(blocks)}: q8_0 and q4_0 blocks are written by the fused decoder layers only, and this "
        f"model's layers run mlx-lm's code ({why}); the cache keeps f16 there"
        if blocks
        else None
    )
    _STORED[id(loaded.model)] = kept
    weakref.finalize(loaded.model, _STORED.pop, id(loaded.model), None)
    per_token = _f32_bytes(loaded.config) * sum(t.size for t in kept) // 8
    return dataclasses.replace(
        loaded,
        kv_cache=f"{NAMES[kept[0]]} keys, {NAMES[kept[1]]} values",
        kv_bytes_per_token=per_token,
        kv_note=note,
    )


def store_caches(model: Any, layers: Sequence[Any]) -> None:
    """Give the plain and sliding KV caches among `layers` (a model's, as make_prompt_cache or a
    slot file made them) the type its layers write at, where that is not float32."""
    types = _STORED.get(id(model))
    if types is None:
        return
    for c in cache_kinds.leaves(layers):
        if type(c) in cache_kinds.STORABLE:
            cache_kinds.store_as(c, types)


def row_bytes(head_dim: int, dtype: mx.Dtype) -> int:
    """Bytes of one head's key or value row at a buffer dtype (q8_0, q4_0: the values and their scales)."""
    return cache_kinds.row_width(head_dim, dtype) * dtype.size


def _f32_bytes(cfg: dict) -> int:
    """float32 keys and values over every layer, from a plain transformer's config (0: not known)."""
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads", heads)
    hidden = cfg.get("hidden_size")
    dim = cfg.get("head_dim") or (
        hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
    )
    if not all(isinstance(x, int) and x > 0 for x in (layers, kv_heads, dim)):
        return 0
    return layers * kv_heads * dim * 8

"""The KV cache type a loaded model runs with (--cache-type-k / --cache-type-v), and its size.

Where the fused decoder layers carry the model (models.decoder_layers) its caches hold the chosen
types: `auto` is float16 there (half the bytes a long context reads every step), `f32` keeps
float32, `bf16` is bfloat16, `q8_0` and `q4_0` llama.cpp's 8- and 4-bit blocks (int8 and uint8
buffers whose rows carry their scales: q8_0 is a quarter of float32's bytes and a little more).
Elsewhere mlx-lm's layer code writes the cache in the model's activations' dtype (float32 on the
CPU paths), so an explicit `f16` cannot apply: the model runs, `kv_note` says why
in one line, and the reports name the type really in use.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

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
    note = None
    asked = [
        f"{flag} {t}" for flag, t in zip(("--cache-type-k", "--cache-type-v"), cache_types) if t not in ("auto", "f32")
    ]
    if asked:
        why = decoder_layers.why_not(loaded.model) or "its layers run mlx-lm's code"
        note = f"{' and '.join(asked)}: this model keeps a float32 KV cache ({why}); use f32 or auto"
    return dataclasses.replace(
        loaded, kv_cache="f32 keys, f32 values", kv_bytes_per_token=_f32_bytes(loaded.config), kv_note=note
    )


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

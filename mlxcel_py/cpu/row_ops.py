"""The kernel's row-at-a-time operations besides matmuls: attention (alone, and over a batched
forward's caches), SwiGLU, RoPE, and moving KV rows. Each treats every row alone, so a row's result
does not depend on the block it is in (what makes verify rows equal decode steps).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .extension import kernel_status


def _row_count(x: mx.array) -> int:
    return x.size // x.shape[-1] if x.ndim else 1


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool) -> mx.array:
    """The extension's attention, one query row at a time (cpu_kernels.enable_row_exact)."""
    qmm, _ = kernel_status()
    return qmm.row_exact_attention(q, k, v, scale, causal)


def attention_at(dtypes: tuple[mx.Dtype, mx.Dtype]):
    """`attention` over keys and values rounded to the cache type `dtypes` (keys, values), for
    a model whose fused layers keep float16 caches (models.decoder_layers): a forward that takes
    mlx-lm's layer code instead (a reference run, a block the fused op does not take) reads its
    float32 rows as the fused layers would have stored them, so both give the same bits. A q8_0
    or q4_0 side (int8, uint8) is quantized as the layers quantize a row they write (`kv_rows`, eager: a
    reference path, not the decode path)."""
    qmm, _ = kernel_status()
    k_type, v_type = dtypes

    def rounded(x: mx.array, t: mx.Dtype) -> mx.array:
        if t not in (mx.int8, mx.uint8):  # q8_0, q4_0
            return x.astype(t)
        return x if x.dtype == t else qmm.kv_rows(x, t)

    def at(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool) -> mx.array:
        return attention(q, rounded(k, k_type), rounded(v, v_type), scale, causal)

    return at


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x in one vectorised op (cpu_kernels.enable_row_exact): MLX's own is several
    ops with an element-at-a-time exp on this wheel, 0.6 ms a layer at 64 rows against 0.04."""
    qmm, _ = kernel_status()
    return qmm.row_swiglu(gate, x)


class RowExactRoPE(nn.Module):
    """mlx's nn.RoPE through the extension (`patch_rope`): the cos/sin of a forward's positions are
    computed once for all its layers, and each batch entry may sit at its own offset (a batched
    forward's rows). MLX's CPU rope builds a graph of about ten ops per call (0.13 ms, 60 calls a
    forward on the default model). Every forward of the model goes through it, so a row's
    rotation depends only on its position, whatever block it is in."""

    def __init__(self, rope: nn.RoPE):
        super().__init__()
        self.dims, self.traditional, self.base, self.scale = rope.dims, rope.traditional, rope.base, rope.scale
        self._stock = rope
        self.freeze()

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        if x.ndim != 4 or x.dtype != mx.float32:
            return self._stock(x, offset=offset)
        qmm, _ = kernel_status()
        if isinstance(offset, mx.array):
            return qmm.row_rope(x, self.dims, self.traditional, float(self.base), float(self.scale), 0, offset)
        return qmm.row_rope(x, self.dims, self.traditional, float(self.base), float(self.scale), int(offset))


def patch_rope(model: Any) -> int:
    """Give every plain nn.RoPE of `model` the extension's rope; returns how many were replaced.
    (Scaled variants, Llama3RoPE, YaRN... keep their own.)"""
    count = 0
    for _, parent in model.named_modules():
        rope = parent.get("rope") if isinstance(parent, dict) else getattr(parent, "rope", None)
        if type(rope) is nn.RoPE and rope.base is not None:
            parent.rope = RowExactRoPE(rope)
            count += 1
    return count


def cache_attention(
    q: mx.array,
    k_new: mx.array,
    v_new: mx.array,
    k_bufs: list,
    v_bufs: list,
    seq: list[int],
    pos: list[int],
    scale: float,
    tree: Any = None,
) -> list[mx.array]:
    """One layer of a batched forward (batch.RowCaches): entry e's new keys and values written into
    sequence seq[e]'s buffers from position pos[e] on, and each query row attended over its own
    sequence up to its position, by the same one-row code as `attention`. Returns [attention,
    key buffers..., value buffers...]. `tree`: draft-tree rows (engine.tree.Layout's slot, base
    and tail for every entry): each written at its slot, attending its prefix and tail."""
    qmm, _ = kernel_status()
    if tree is None:
        return qmm.row_exact_cache_attention(q, k_new, v_new, k_bufs, v_bufs, seq, pos, scale)
    return qmm.row_exact_cache_attention(
        q, k_new, v_new, k_bufs, v_bufs, seq, pos, scale, slot=tree.slot, base=tree.base, tail=tree.tail
    )


def move_rows(bufs: list, rows: list[int], first: int) -> list[mx.array]:
    """KV buffers [1, heads, capacity, dim] with row rows[j] moved to row first + j (rows
    increasing, at or after first + j), in place where nothing else holds a buffer."""
    qmm, _ = kernel_status()
    return qmm.move_rows(bufs, rows, first)

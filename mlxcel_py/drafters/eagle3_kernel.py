"""EAGLE-3's midlayer as one op on the row-exact kernel: `_qmm.DecoderLayer` with `in2_norm`.

Why: through the network's MLX code (eagle3_net.py) a draft step is about twenty ops (two norms,
a concatenation, the projections, reshapes, rope, the cache write, attention, the MLP) whose
dispatch, not their arithmetic, made most of it: 0.55 ms a step on this 2-core CPU against 2.9 ms
for a whole target step, so each draft cost a fifth of the token it might save. The fused op is
the target's own decoder-layer kernel (csrc/layer_kernel.cpp) with the one difference EAGLE-3's
layer has: q/k/v read [input_layernorm(embedding); hidden_norm(hidden)], 2H inputs, while the
unnormed hidden state stays the residual. A step is then the embedding, this op, the final norm
and the output layer.

Precision: the op's arithmetic is the kernel's (float32 rows, the 4-bit weights `on_the_kernel`
made), close to the MLX path but not its bits; a drafter's arithmetic only moves which drafts
are accepted, never the output (the target verifies every token).

Where it does not apply (no kernel, `norm_before_residual`, a scaled rope, float linears of
another layout) the network's MLX code runs as before.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..models import cache_kinds

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KV_DTYPES = (mx.float32, mx.float32)  # a drafter's cache is a few hundred rows: no reason to round them


def why_not(net: Any) -> str | None:
    """Why `net`'s midlayer cannot run as one op, or None."""
    from ..cpu import layers as cpu_layers
    from ..cpu.extension import kernel_status

    qmm, _ = kernel_status()
    if qmm is None or not hasattr(qmm, "DecoderLayer"):
        return "the row-exact kernel is not in use"
    if net.spec.norm_before_residual:
        return "norm_before_residual"
    if type(net.rope) is not nn.RoPE:
        return "a scaled rope"
    layer = net.midlayer
    mods = [getattr(layer.self_attn, n) for n in LINEARS[:4]] + [getattr(layer.mlp, n) for n in LINEARS[4:]]
    if any(type(m) is not cpu_layers.RowExactLinear for m in mods):
        return "its linears are not quantized on the kernel"
    if len({m.bits for m in mods}) != 1:
        return "its linears mix bit widths"
    return None


class FusedMidLayer:
    """`Eagle3Net.step` through one kernel op (see the module note); same arguments, same results
    up to the kernel's rounding."""

    def __init__(self, net: Any):
        from ..cpu.extension import kernel_status

        qmm, _ = kernel_status()
        layer, attn, spec = net.midlayer, net.midlayer.self_attn, net.spec
        mods = [getattr(attn, n) for n in LINEARS[:4]] + [getattr(layer.mlp, n) for n in LINEARS[4:]]
        self.net = net
        self.kv_heads, self.head_dim = attn.n_kv, attn.head_dim
        f32 = mx.float32
        self.op = qmm.DecoderLayer(
            [m["weight"] for m in mods],
            [m["scales"] for m in mods],
            [m["biases"] for m in mods],
            [m.bits for m in mods],
            [m["bias"] if "bias" in m else None for m in mods],
            layer.input_layernorm.weight.astype(f32),
            layer.post_attention_layernorm.weight.astype(f32),
            None,
            None,
            float(spec.rms_norm_eps),
            0.0,
            attn.n_heads,
            attn.n_kv,
            attn.head_dim,
            int(net.rope.dims),
            bool(net.rope.traditional),
            float(net.rope.base),
            float(net.rope.scale),
            float(attn.scale),
            in2_norm=layer.hidden_norm.weight.astype(f32),
        )

    def step(self, embedded: mx.array, hidden: mx.array, cache: list, last_only: bool) -> tuple[mx.array, mx.array]:
        kv = cache[0]
        rows = hidden.shape[1]
        cache_kinds.reserve(kv, rows, self.kv_heads, self.head_dim, KV_DTYPES)
        start = kv.offset
        out, kv.keys, kv.values = self.op(
            hidden, [kv.keys], [kv.values], [0] * rows, list(range(start, start + rows)), e=embedded
        )
        kv.offset = start + rows
        if last_only:
            out = out[:, -1:]
        return self.net.lm_head(self.net.norm(out)), out


def fuse(net: Any) -> FusedMidLayer | None:
    """The fused step for `net`, or None where `why_not` says it cannot run."""
    return FusedMidLayer(net) if why_not(net) is None else None

"""The DFlash drafter's network (z-lab's DFlashDraftModel; arXiv 2602.06036), from its config.json.

A block-diffusion drafter: one forward drafts a whole block. Its input is the target's own hidden
states (the outputs of decoder layers `target_layer_ids`, side by side) projected by `fc` and
normed (`hidden_norm`): the context, one row per committed position, shared by every draft layer.
The block is `[last committed token, mask x (B-1)]` embedded by the target's embedding. In each
layer the queries come from the block only; keys and values are the layer's k/v projections of
the context rows followed by those of the block, with no mask inside the block (non-causal;
sliding-window layers where `layer_types` says so). Row i of the output, through the target's
lm_head, is the draft for position (block start + i): one forward gives B-1 drafts.

Two forms of the same arithmetic: `draft` runs incrementally (each layer's context keys and
values are cached, so a round only projects the rows committed since the last), `train_logits`
runs all at once over a sequence (every block sees the context before its anchor), the form a
drafter is trained in. tests/test_dflash.py trains a tiny one with it and shows the incremental
form accepting its drafts.

Where the checkpoint is silent the reference implementations agree on: SwiGLU MLP, per-head
RMSNorm on queries and keys (context keys too), RoPE over absolute positions (the context's rows
at their positions, the block after them), the drafter's own rope settings. The context rows are
the layers' raw outputs, before the target's final norm (z-lab's MLX code; its PyTorch code takes
the final norm's output for the last layer, which no published checkpoint taps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.qwen3 import MLP  # SwiGLU: gate, up, down


@dataclass(frozen=True)
class Spec:
    """A DFlash checkpoint's sizes, as its config.json gives them (see `dflash.read_spec`)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    mask_token_id: int
    block_size: int | None
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    quantization: dict | None = None

    def window(self, layer: int) -> int | None:
        """The layer's sliding window, or None (full attention)."""
        if self.sliding_window and layer < len(self.layer_types) and self.layer_types[layer] == "sliding_attention":
            return int(self.sliding_window)
        return None

    def expected_shapes(self) -> dict[str, list[int]]:
        """Every float tensor of the checkpoint and its shape (quantized linears: see dflash)."""
        H, inner, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        out = {
            "fc.weight": [H, len(self.target_layer_ids) * H],
            "hidden_norm.weight": [H],
            "norm.weight": [H],
        }
        for i in range(self.num_hidden_layers):
            p = f"layers.{i}."
            out |= {
                p + "input_layernorm.weight": [H],
                p + "post_attention_layernorm.weight": [H],
                p + "self_attn.q_proj.weight": [q, H],
                p + "self_attn.k_proj.weight": [kv, H],
                p + "self_attn.v_proj.weight": [kv, H],
                p + "self_attn.o_proj.weight": [H, q],
                p + "self_attn.q_norm.weight": [hd],
                p + "self_attn.k_norm.weight": [hd],
                p + "mlp.gate_proj.weight": [inner, H],
                p + "mlp.up_proj.weight": [inner, H],
                p + "mlp.down_proj.weight": [H, inner],
            }
            if self.attention_bias:
                out |= {
                    p + "self_attn.q_proj.bias": [q],
                    p + "self_attn.k_proj.bias": [kv],
                    p + "self_attn.v_proj.bias": [kv],
                    p + "self_attn.o_proj.bias": [H],
                }
        return out


class Attention(nn.Module):
    def __init__(self, spec: Spec, window: int | None):
        super().__init__()
        H, hd, bias = spec.hidden_size, spec.head_dim, spec.attention_bias
        self.n_heads, self.n_kv, self.head_dim = spec.num_attention_heads, spec.num_key_value_heads, hd
        self.scale = hd**-0.5
        self.window = window
        self.q_proj = nn.Linear(H, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(H, self.n_kv * hd, bias=bias)
        self.v_proj = nn.Linear(H, self.n_kv * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, H, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=spec.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=spec.rms_norm_eps)

    def _heads(self, x: mx.array, heads: int) -> mx.array:
        B, L, _ = x.shape
        return x.reshape(B, L, heads, self.head_dim)

    def keys_values(self, x: mx.array, rope: Any, offset: Any) -> tuple[mx.array, mx.array]:
        """Roped, normed keys and values of rows `x` (B, L, H) at positions offset.. : (B, kv, L, hd)."""
        k = self.k_norm(self._heads(self.k_proj(x), self.n_kv)).transpose(0, 2, 1, 3)
        v = self._heads(self.v_proj(x), self.n_kv).transpose(0, 2, 1, 3)
        return rope(k, offset=offset), v

    def __call__(self, x, ctx_keys, ctx_values, rope, offset, mask) -> mx.array:
        """Block rows x (B, L, H) at positions offset.. over the context's keys (or None) and their own."""
        B, L, _ = x.shape
        q = rope(self.q_norm(self._heads(self.q_proj(x), self.n_heads)).transpose(0, 2, 1, 3), offset=offset)
        k, v = self.keys_values(x, rope, offset)
        if ctx_keys is not None:
            if ctx_keys.shape[0] != B:  # one context for several blocks (training)
                ctx_keys = mx.broadcast_to(ctx_keys, (B, *ctx_keys.shape[1:]))
                ctx_values = mx.broadcast_to(ctx_values, (B, *ctx_values.shape[1:]))
            k, v = mx.concatenate([ctx_keys, k], axis=2), mx.concatenate([ctx_values, v], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class Layer(nn.Module):
    def __init__(self, spec: Spec, index: int):
        super().__init__()
        self.self_attn = Attention(spec, spec.window(index))
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)

    def __call__(self, x, ctx_keys, ctx_values, rope, offset, mask) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), ctx_keys, ctx_values, rope, offset, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


def _window_mask(q_pos: mx.array, k_pos: mx.array, window: int) -> mx.array:
    """True where a query may see a key in a sliding-window layer: fewer than `window` positions
    apart, either way (the block is non-causal)."""
    return mx.abs(q_pos[..., :, None] - k_pos[..., None, :]) < window


class DFlashNet(nn.Module):
    def __init__(self, spec: Spec):
        super().__init__()
        from mlx_lm.models.rope_utils import initialize_rope

        self.spec = spec
        H = spec.hidden_size
        self.fc = nn.Linear(len(spec.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = nn.RMSNorm(H, eps=spec.rms_norm_eps)
        self.layers = [Layer(spec, i) for i in range(spec.num_hidden_layers)]
        self.norm = nn.RMSNorm(H, eps=spec.rms_norm_eps)
        self.rope = initialize_rope(
            spec.head_dim,
            base=spec.rope_theta,
            traditional=False,
            scaling_config=spec.rope_scaling,
            max_position_embeddings=spec.max_position_embeddings,
        )

    def context(self, features: mx.array) -> mx.array:
        """Target features (…, n_taps * H) -> the context rows every layer's keys and values read."""
        return self.hidden_norm(self.fc(features))

    def make_cache(self) -> list:
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in self.layers]

    def draft(self, block: mx.array, features: mx.array | None, cache: list, *, base: int, start: int) -> mx.array:
        """The incremental forward. `block` (1, B, H): the embedded block at positions start..;
        `features` (1, n, F): the target's rows of the positions the cache lacks (ending at start,
        or None); `cache` holds the context keys/values of positions base.. . Returns the normed
        output rows (1, B, H); the cache then covers base..start-1."""
        ctx = self.context(features) if features is not None and features.shape[1] else None
        fed = cache[0].offset
        out = block
        for layer, c in zip(self.layers, cache):
            attn = layer.self_attn
            if ctx is not None:
                k, v = attn.keys_values(ctx, self.rope, base + fed)
                keys, values = c.update_and_fetch(k, v)
            elif c.offset:
                keys, values = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
            else:
                keys = values = None
            mask = None
            if attn.window is not None:
                n = keys.shape[2] if keys is not None else 0
                k_pos = mx.arange(base, base + n) if n else mx.zeros((0,), dtype=mx.int32)
                k_pos = mx.concatenate([k_pos, mx.arange(start, start + block.shape[1])])
                mask = _window_mask(mx.arange(start, start + block.shape[1]), k_pos, attn.window)
            out = layer(out, keys, values, self.rope, start, mask)
        return self.norm(out)

    def train_logits(self, features: mx.array, embedded_blocks: mx.array, anchors: mx.array, lm_head) -> mx.array:
        """The all-at-once forward over one sequence: `features` (1, N, F) of positions 0..N-1,
        `embedded_blocks` (m, B, H) of blocks starting at `anchors` (m,), each seeing the context
        rows before its anchor and its own rows. Returns logits (m, B, V)."""
        ctx = self.context(features)
        N, (m, B, _) = features.shape[1], embedded_blocks.shape
        k_pos = mx.arange(N)
        q_pos = anchors[:, None] + mx.arange(B)[None]  # (m, B)
        sees_ctx = mx.broadcast_to(k_pos[None, None, :] < anchors[:, None, None], (m, B, N))
        full = mx.concatenate([sees_ctx, mx.ones((m, B, B), dtype=mx.bool_)], axis=-1)
        out = embedded_blocks
        for layer in self.layers:
            attn = layer.self_attn
            keys, values = attn.keys_values(ctx, self.rope, 0)
            mask = full
            if attn.window is not None:
                all_pos = mx.concatenate([mx.broadcast_to(k_pos[None], (m, N)), q_pos], axis=-1)
                mask = mask & _window_mask(q_pos, all_pos, attn.window)
            out = layer(out, keys, values, self.rope, anchors, mask[:, None])
        return lm_head(self.norm(out))

"""The EAGLE-3 drafter's network (LlamaForCausalLMEagle3; arXiv 2503.01840), from its config.json.

One Llama decoder layer (`midlayer`) that reads two inputs per position: the embedding of a token
and a hidden state. For the positions the target committed the hidden state is the target's own
features: its residual stream before three layers (low, middle, high), side by side, projected
by `fc` (3H -> H). For the drafter's later steps it is its own output before the final norm.

    e = input_layernorm(embed(x_{t+1}));  r = hidden;  g = hidden_norm(hidden)
    h = r + o_proj(attention(q/k/v_proj([e; g])))        (q/k/v read 2H inputs)
    out = h + mlp(post_attention_layernorm(h))            (the next step's hidden)
    logits_draft = lm_head(norm(out))                     (over the draft vocabulary)

With `norm_before_residual` the residual r is hidden_norm(hidden) instead (vLLM's option). The
drafter's own lm_head covers `draft_vocab_size` tokens; draft id d is target id d + d2t[d].
Attention is causal over the layer's own cache, rope at the target positions of the pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.qwen3 import MLP  # SwiGLU: gate, up, down


@dataclass(frozen=True)
class Spec:
    """An EAGLE-3 checkpoint's sizes, as its config.json gives them (see `eagle3.read_spec`)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    rms_norm_eps: float
    aux_layer_ids: tuple[int, ...]  # vLLM's indexing: id j = the residual stream before layer j
    rope_theta: float = 500_000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    attention_bias: bool = False
    norm_before_residual: bool = False
    has_embedding: bool = False  # the checkpoint carries its own embed_tokens (else the target's)

    def expected_shapes(self) -> dict[str, list[int]]:
        H, inner, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        p = "midlayer."
        out = {
            "fc.weight": [H, len(self.aux_layer_ids) * H],
            "norm.weight": [H],
            "lm_head.weight": [self.draft_vocab_size, H],
            p + "input_layernorm.weight": [H],
            p + "hidden_norm.weight": [H],
            p + "post_attention_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [q, 2 * H],
            p + "self_attn.k_proj.weight": [kv, 2 * H],
            p + "self_attn.v_proj.weight": [kv, 2 * H],
            p + "self_attn.o_proj.weight": [H, q],
            p + "mlp.gate_proj.weight": [inner, H],
            p + "mlp.up_proj.weight": [inner, H],
            p + "mlp.down_proj.weight": [H, inner],
        }
        if self.attention_bias:
            out |= {p + f"self_attn.{n}_proj.bias": [s] for n, s in (("q", q), ("k", kv), ("v", kv))}
        if self.has_embedding:
            out["embed_tokens.weight"] = [self.vocab_size, H]
        return out


class Attention(nn.Module):
    def __init__(self, spec: Spec):
        super().__init__()
        H, hd, bias = spec.hidden_size, spec.head_dim, spec.attention_bias
        self.n_heads, self.n_kv, self.head_dim = spec.num_attention_heads, spec.num_key_value_heads, hd
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(2 * H, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(2 * H, self.n_kv * hd, bias=bias)
        self.v_proj = nn.Linear(2 * H, self.n_kv * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, H, bias=False)

    def __call__(self, x: mx.array, rope: Any, cache: Any, mask: Any) -> mx.array:
        B, L, _ = x.shape

        def heads(t, n):
            return t.reshape(B, L, n, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = (
            heads(self.q_proj(x), self.n_heads),
            heads(self.k_proj(x), self.n_kv),
            heads(self.v_proj(x), self.n_kv),
        )
        offset = cache.offset if cache is not None else 0
        q, k = rope(q, offset=offset), rope(k, offset=offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MidLayer(nn.Module):
    def __init__(self, spec: Spec):
        super().__init__()
        H, eps = spec.hidden_size, spec.rms_norm_eps
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = nn.RMSNorm(H, eps=eps)
        self.hidden_norm = nn.RMSNorm(H, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=eps)
        self.norm_before_residual = spec.norm_before_residual

    def __call__(self, embedded, hidden, rope, cache, mask) -> mx.array:
        g = self.hidden_norm(hidden)
        residual = g if self.norm_before_residual else hidden
        x = mx.concatenate([self.input_layernorm(embedded), g], axis=-1)
        h = residual + self.self_attn(x, rope, cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Net(nn.Module):
    def __init__(self, spec: Spec):
        super().__init__()
        from mlx_lm.models.rope_utils import initialize_rope

        self.spec = spec
        H = spec.hidden_size
        self.fc = nn.Linear(len(spec.aux_layer_ids) * H, H, bias=False)
        self.midlayer = MidLayer(spec)
        self.norm = nn.RMSNorm(H, eps=spec.rms_norm_eps)
        self.lm_head = nn.Linear(H, spec.draft_vocab_size, bias=False)
        if spec.has_embedding:
            self.embed_tokens = nn.Embedding(spec.vocab_size, H)
        self.rope = initialize_rope(
            spec.head_dim,
            base=spec.rope_theta,
            traditional=False,
            scaling_config=spec.rope_scaling,
            max_position_embeddings=spec.max_position_embeddings,
        )
        self.d2t = mx.zeros((spec.draft_vocab_size,), dtype=mx.int32)  # set by load (a buffer, not trained)
        self.fused = None  # eagle3_kernel.FusedMidLayer, set by eagle3.on_the_kernel where it runs

    def make_cache(self) -> list:
        from mlx_lm.models.cache import KVCache

        return [KVCache()]

    def step(
        self, embedded: mx.array, hidden: mx.array, cache: list, *, last_only: bool = False
    ) -> tuple[mx.array, mx.array]:
        """Rows (1, L, H) of embeddings and hidden states at the cache's next positions (causal):
        (the draft-vocabulary logits of every row, its output before the final norm). `last_only`:
        the last row's alone (drafting reads only it: catching up on 100 positions, the output
        layer was half the step)."""
        from mlx_lm.models.base import create_attention_mask

        if self.fused is not None and cache is not None:
            return self.fused.step(embedded, hidden, cache, last_only)
        mask = create_attention_mask(embedded, cache[0]) if cache is not None else "causal"
        out = self.midlayer(embedded, hidden, self.rope, cache[0] if cache is not None else None, mask)
        if last_only:
            out = out[:, -1:]
        return self.lm_head(self.norm(out)), out

    def features(self, tapped: mx.array) -> mx.array:
        """The target's tapped rows (…, 3H) -> the hidden input of a committed position."""
        return self.fc(tapped)

    def target_ids(self) -> mx.array:
        """Target token id of every draft id."""
        return mx.arange(self.spec.draft_vocab_size, dtype=mx.int32) + self.d2t

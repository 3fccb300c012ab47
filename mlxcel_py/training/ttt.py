"""EAGLE-3's training-time test: the drafter is trained on the inputs it will see while drafting,
its own outputs fed back, not only on the target's features.

For a sample x_0..x_{T-1} with the target's tapped features f_j, step 1 reads the pairs
(f_j, x_{j+1}) at rope position j and predicts x_{j+2}, causally, as the real pairs go in at
inference. Step k (k >= 2) at index j is what the drafter does k-1 drafts after its last real
pair j: it reads its own step k-1 output at j with token x_{j+k}, at position j+k-1, attends
to the real pairs 0..j (step 1's keys) and to its own earlier self-fed entries at j (steps
2..k-1's keys, one each), and predicts x_{j+k+1}. That is `Eagle3Drafter._draft`'s cache,
entry for entry, so what is trained is what runs. The forward reuses the network's own modules
(drafters/eagle3_net.py), so the trained parameters are the checkpoint's as they are.

The loss is cross-entropy over the draft vocabulary at answer positions whose label the draft
vocabulary holds, step k weighted 0.8^(k-1) (EAGLE-3's decay); `top1` counts step 1's hits.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..drafters.eagle3_net import Eagle3Net

STEP_DECAY = 0.8


def _heads(t: mx.array, n: int, hd: int) -> mx.array:
    B, L, _ = t.shape
    return t.reshape(B, L, n, hd).transpose(0, 2, 1, 3)


def unrolled(
    net: Eagle3Net, embed: Any, features: mx.array, tokens: mx.array, steps: int, labels: mx.array | None = None
) -> list[tuple[mx.array, mx.array]]:
    """(draft-vocabulary logits (1, m_k, Vd), target ids predicted (1, m_k)) of steps 1..`steps`;
    features (1, T-1, F) float, tokens (1, T) int32; labels (1, T): the id to predict at each
    position (the target's greedy pick; default the tokens themselves)."""
    labels = tokens if labels is None else labels
    layer, attn = net.midlayer, net.midlayer.self_attn
    hd, nh, nkv = attn.head_dim, attn.n_heads, attn.n_kv
    rep = nh // nkv
    T = tokens.shape[1]
    n = T - 2
    hidden = net.features(features[:, :n])
    keys: list[mx.array] = []
    values: list[mx.array] = []
    out = []
    for k in range(1, steps + 1):
        m = n - (k - 1)
        if m <= 0:
            break
        hid = hidden[:, :m]
        e = embed(tokens[:, k : k + m])
        g = layer.hidden_norm(hid)
        residual = g if layer.norm_before_residual else hid
        x = mx.concatenate([layer.input_layernorm(e), g], axis=-1)
        q = net.rope(_heads(attn.q_proj(x), nh, hd), offset=k - 1)
        kk = net.rope(_heads(attn.k_proj(x), nkv, hd), offset=k - 1)
        vv = _heads(attn.v_proj(x), nkv, hd)
        if rep > 1:
            kk, vv = mx.repeat(kk, rep, axis=1), mx.repeat(vv, rep, axis=1)
        keys = [t[:, :, :m] for t in keys] + [kk]
        values = [t[:, :, :m] for t in values] + [vv]
        # step 1's keys causally (real pairs 0..j), each later step's key at j only (the diagonal)
        s1 = (q @ keys[0].transpose(0, 1, 3, 2)) * attn.scale
        causal = mx.triu(mx.full((m, m), -mx.inf, dtype=s1.dtype), k=1)
        scores = [s1 + causal] + [(q * kd).sum(-1, keepdims=True) * attn.scale for kd in keys[1:]]
        p = mx.softmax(mx.concatenate(scores, axis=-1), axis=-1)
        o = p[..., :m] @ values[0]
        for i, vd in enumerate(values[1:]):
            o = o + p[..., m + i : m + i + 1] * vd
        o = attn.o_proj(o.transpose(0, 2, 1, 3).reshape(1, m, -1))
        h = residual + o
        hidden = h + layer.mlp(layer.post_attention_layernorm(h))
        out.append((net.lm_head(net.norm(hidden)), labels[:, k + 1 : k + 1 + m]))
    return out


def loss(
    net: Eagle3Net,
    embed: Any,
    features: mx.array,
    tokens: mx.array,
    prompt_len: int,
    lut: mx.array,
    steps: int,
    labels: mx.array | None = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """(weighted mean loss, step-1 hits, step-1 counted positions). lut: target id -> draft id or -1."""
    total = mx.array(0.0)
    weight = 0.0
    hits = count = mx.array(0)
    for k, (logits, wanted) in enumerate(unrolled(net, embed, features, tokens, steps, labels), 1):
        m = wanted.shape[1]
        target_pos = mx.arange(m) + k + 1  # the position each label stands at
        d = lut[wanted]
        ok = (d >= 0) & (target_pos >= prompt_len)[None]
        n_ok = ok.sum()
        ce = nn.losses.cross_entropy(logits.astype(mx.float32), mx.maximum(d, 0))
        total = total + STEP_DECAY ** (k - 1) * (ce * ok).sum() / mx.maximum(n_ok, 1)
        weight += STEP_DECAY ** (k - 1)
        if k == 1:
            hits = ((mx.argmax(logits, -1) == d) & ok).sum()
            count = n_ok
    return total / weight, hits, count

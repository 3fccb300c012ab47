"""Gemma 4's assistant drafter (`gemma4_assistant` checkpoints), run as the mtp kind.

Google ships Gemma 4's multi-token-prediction head as a separate small model (for example
google/gemma-4-E2B-it-assistant, config `model_type: gemma4_assistant`, its decoder config under
`text_config`). Its tensors: `pre_projection` (2 x backbone -> H), `model.layers.*` (Gemma 4
decoder layers that own no K/V: each attends over the target's K/V of its layer type, taken from
the target's last cache-holding layer of that type), `model.norm`, `post_projection`
(H -> backbone), the drafter's own `model.embed_tokens` as its tied lm_head (or `lm_head`), and
for the small models a centroid-routed sparse lm_head (`masked_embedding`).

A draft step: x = pre_projection([target_embed(token) * embed_scale; h_prev]); the layers at one
query position (the target's cache length), attending over the target's K/V both ways, within
the sliding window on sliding layers; h = norm(x); logits = lm_head(h); h_prev = post_projection(h).
The first h_prev is the target's last hidden state (its final norm's output), later ones the
drafter's own. The drafter keeps no cache, so there is nothing of its own to roll back: after a
verify the next round attends to the target's K/V, which the verify round already rolled back.
The layout follows the published checkpoints as mlx-vlm and vLLM read them; no real checkpoint is
reachable from this machine, so tests prove mechanics and exactness with random weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import ModelError
from ..models.cache_kinds import time_ordered
from ..models.config import text_config
from ..models.safetensors import load_tensors, tensor_shapes
from ..models.taps import hidden_tap, lm_head_and_embed, text_model
from .base import Drafter, Proposal, chain_proposal, draw

TARGETS = ("gemma4", "gemma4_text")


def text_args(cfg: dict):
    """The assistant's decoder args: every layer reads the target's K/V, none owns any."""
    from mlx_lm.models.gemma4_text import ModelArgs

    tc = dict(cfg.get("text_config") or {})
    n = int(tc.get("num_hidden_layers", 1))
    tc.update(num_kv_shared_layers=n, hidden_size_per_layer_input=0, model_type="gemma4_text")
    return ModelArgs.from_dict(tc)


class MaskedEmbedder(nn.Module):
    """Centroid-routed sparse lm_head: score `num_centroids` clusters, expand the top-k clusters
    to their tokens (`token_ordering`), score those densely, the rest of the vocabulary gets the
    lowest selected logit minus one."""

    def __init__(self, cfg: dict, hidden: int, vocab: int):
        super().__init__()
        self.num_centroids = int(cfg["num_centroids"])
        self.top_k = int(cfg["centroid_intermediate_top_k"])
        self.vocab = vocab
        self.centroids = nn.Linear(hidden, self.num_centroids, bias=False)
        self.token_ordering = mx.zeros((vocab,), dtype=mx.int32)
        self.freeze(keys="token_ordering", recurse=False)

    def __call__(self, h: mx.array, embed_weight: mx.array) -> mx.array:
        top = mx.argpartition(self.centroids(h), kth=-self.top_k, axis=-1)[..., -self.top_k :]
        ordering = self.token_ordering.astype(mx.int32).reshape(self.num_centroids, -1)
        ids = ordering[top].reshape(*h.shape[:-1], -1)  # (B, L, top_k * per_centroid)
        scores = (embed_weight[ids] @ h[..., :, None])[..., 0]
        out = mx.broadcast_to(scores.min(axis=-1, keepdims=True) - 1, (*h.shape[:-1], self.vocab))
        return mx.put_along_axis(out, ids, scores, axis=-1)


class _Inner(nn.Module):
    def __init__(self, args):
        super().__init__()
        from mlx_lm.models.gemma4_text import DecoderLayer

        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, layer_idx=i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Gemma4Assistant(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.args = args = text_args(cfg)
        backbone = int(cfg["backbone_hidden_size"])
        self.model = _Inner(args)
        self.pre_projection = nn.Linear(2 * backbone, args.hidden_size, bias=False)
        self.post_projection = nn.Linear(args.hidden_size, backbone, bias=False)
        self.tied = bool(cfg.get("tie_word_embeddings", True))
        if not self.tied:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if cfg.get("use_ordered_embeddings"):
            self.masked_embedding = MaskedEmbedder(cfg, args.hidden_size, args.vocab_size)

    def logits(self, h: mx.array) -> mx.array:
        if "masked_embedding" in self:
            return self.masked_embedding(h, self.model.embed_tokens.weight)
        return self.model.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)

    def step(self, embedded: mx.array, h_prev: mx.array, kv: dict, masks: dict, position: int):
        """One draft step: (logits (1, V), the next h_prev)."""
        x = self.pre_projection(mx.concatenate([embedded, h_prev], axis=-1))
        offset = mx.array(position)
        for layer in self.model.layers:
            x, _, _ = layer(x, mask=masks[layer.layer_type], cache=None, shared_kv=kv[layer.layer_type], offset=offset)
        h = self.model.norm(x)
        return self.logits(h)[0].astype(mx.float32), self.post_projection(h)

    def drafter(self, target_model: Any, target_vocab: int | None) -> AssistantDrafter:
        return AssistantDrafter(self, target_model, target_vocab)


def check_target(target_cfg: dict, cfg: dict, where: str) -> None:
    """Config-level refusals, before any weight loads."""
    if target_cfg.get("model_type") not in TARGETS:
        raise ModelError(
            f"{where} is a Gemma 4 assistant, which drafts only for Gemma 4 targets; the target is a "
            f"{target_cfg.get('model_type')} model"
        )
    tcfg = text_config(target_cfg)
    tc = cfg.get("text_config") or {}
    checks = [
        ("backbone_hidden_size", cfg.get("backbone_hidden_size"), tcfg.get("hidden_size"), "hidden size"),
        ("text_config.vocab_size", tc.get("vocab_size"), tcfg.get("vocab_size"), "vocabulary"),
    ]
    for key in ("head_dim", "global_head_dim", "num_key_value_heads"):
        if key in tc and key in tcfg:
            checks.append((f"text_config.{key}", tc.get(key), tcfg.get(key), f"K/V {key}"))
    for key, mine, theirs, what in checks:
        if mine != theirs:
            raise ModelError(
                f"{where}: the assistant's {key} ({mine}) does not match the target's {what} "
                f"({theirs}); use the assistant made for this target"
            )


def load(folder: Path, cfg: dict, target_model: Any) -> Gemma4Assistant:
    head = Gemma4Assistant(cfg)
    weights: dict[str, mx.array] = {}
    for f in sorted({f for f, _ in tensor_shapes(folder).values()}):
        weights.update(load_tensors(f))
    weights = {k: v for k, v in weights.items() if "rotary_emb" not in k}
    if head.tied:
        weights.pop("lm_head.weight", None)
    expected = {k for k, _ in tree_flatten(head.parameters())}
    missing = sorted(expected - set(weights))
    if missing:
        raise ModelError(
            f"--draft-model {folder}: the Gemma 4 assistant checkpoint lacks {missing[0]}"
            + (f" and {len(missing) - 1} more tensors" if len(missing) > 1 else "")
        )
    dtype = lm_head_and_embed(target_model)[1].weight.dtype
    head.load_weights(
        [(k, v if k.endswith("token_ordering") else v.astype(dtype)) for k, v in weights.items() if k in expected],
        strict=False,
    )
    mx.eval(head.parameters())
    return head


# ---- the drafter ---------------------------------------------------------------------------------
def _kv_layers(target_model: Any) -> dict[str, int]:
    """Per layer type, the target's last layer that holds a cache (its K/V is what the target's own
    KV-shared layers, and the assistant, read)."""
    lm, _ = text_model(target_model)
    args = lm.args
    holders = args.num_hidden_layers - args.num_kv_shared_layers
    return {t: i for i, t in enumerate(args.layer_types[:holders])}


class AssistantDrafter(Drafter):
    kind = "mtp"

    def __init__(self, head: Gemma4Assistant, target_model: Any, target_vocab: int | None = None):
        self.head = head
        self.hidden_tap = hidden_tap(target_model)  # the first step reads the target's last hidden state
        _, self.embed = lm_head_and_embed(target_model)
        self.embed_scale = float(getattr(text_model(target_model)[1], "embed_scale", 1.0))
        self.kv_layers = _kv_layers(target_model)
        self.window = text_model(target_model)[0].args.sliding_window
        self.target_vocab = target_vocab
        self.target = None

    def begin(self, context: Sequence[int], target=None) -> None:
        if target is not None:
            self.target = target

    def commit(self, context: Sequence[int]) -> None:
        pass  # the next round attends to the target's K/V, which the verify round rolled back

    def propose(self, context: Sequence[int], limit: int, decider) -> Proposal:
        target = self.target
        L = len(context)
        if L < 2:  # the target's cache is empty: nothing to attend to yet
            return Proposal([])
        target.settle()  # the K/V must hold every committed position
        position = L - 1  # the target's cache holds x_0 .. x_{L-2}
        kv, masks = {}, {}
        for kind, i in self.kv_layers.items():
            keys, values, n = time_ordered(target.layers[i])
            kv[kind] = (keys, values)
            # keys sit at positions position-n .. position-1; a sliding layer sees |q - k| < window
            masks[kind] = (
                (mx.arange(n, 0, -1) < self.window)[None, None, None, :]
                if kind == "sliding_attention" and n >= self.window
                else None
            )
        h_prev = target.hidden_rows(L - 2, L - 1)[None]
        target.drop_hidden_before(L - 1)
        token = mx.array([[context[-1]]], dtype=mx.int32)
        picks, rows = [], []
        start = L - decider.prompt_len
        for i in range(limit):
            logits, h_prev = self.head.step(self.embed(token) * self.embed_scale, h_prev, kv, masks, position)
            t, q = draw(logits, decider, start + i)
            picks.append(t)
            rows += [q] if q is not None else []
            token = t.reshape(1, 1).astype(mx.int32)
        return chain_proposal(picks, rows, self.target_vocab)

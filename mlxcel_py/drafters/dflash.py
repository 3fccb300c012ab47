"""The DFlash drafter (`--draft-kind dflash`, or a DFlash folder as --draft-model): one forward of
a block-diffusion network drafts a block (dflash_net.py) from the target's own hidden states.

Round for history x_0..x_{L-1}: the target's cache holds positions 0..L-2, and its layer tap
(models.taps.layer_tap over `target_layer_ids`) kept the features of the positions committed since
the last round. Those rows are projected into the drafter's context cache (one entry per committed
position, so it grows by exactly what the target accepted), and the block [x_{L-1}, mask x k]
drafts x_L..x_{L+k-1} in one forward. Greedy drafts are each row's argmax; sampled ones are drawn
from each row's filtered distribution q, which the verifier's lossless p/q rule uses (each row's q
does not depend on the other drafts, so a draw from it is a valid proposal at its position).
Every draft is verified by the shared verify round: output equals plain decoding's whatever the
drafter says, on any target whose cache the engine rolls back (hybrids included).

The context cache outlives a request when the next one shares its prefix (a chat's next turn, a
pooled prompt cache): rows of a common prefix are kept, the rest trimmed. Where the target has no
rows for a stretch (a reused prefix whose features were dropped) the context restarts after it:
the drafts get worse there, never the output.

Before any weight loads, `prepare` checks the checkpoint against the target's config: the
architecture, hidden size, vocabulary, tapped layers, mask token and every tensor's shape, each
refusal naming the file and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..engine.prompt_cache import common_prefix
from ..errors import ModelError
from ..models import loading
from ..models.config import text_config
from ..models.safetensors import load_named, tensor_shapes
from ..models.taps import layer_tap, lm_head_and_embed
from ..options import DraftConfig
from .base import Drafter, NetworkSource, Plan, Proposal, chain_proposal, draw
from .branching import best_first
from .checkpoints import check_shapes, check_sizes, fit
from .dflash_net import DFlashNet, Spec
from .registry import is_dflash_checkpoint as is_dflash

ARCHITECTURE = "DFlashDraftModel"
MAX_LAYERS = 64  # published drafters have 1-8; a config asking for millions is refused, not built
_IGNORED = ("embed_tokens.", "lm_head.")  # some exports carry the target's; the target's own are used


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The taps a checkpoint without target_layer_ids was trained on (z-lab's rule): the middle
    layer for one draft layer, else evenly from layer 1 to layer N-3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers))


def read_spec(cfg: dict, folder: Path, target_layers: int) -> Spec:
    where = f"--draft-model {folder}"
    archs = [str(a) for a in cfg.get("architectures") or []]
    other = [a for a in archs if a != ARCHITECTURE]
    if other:
        name = other[0]
        hint = (
            "DFlash2 drafters are a different network, which mlxcel-py does not run"
            if "dflash2" in name.lower()
            else "mlxcel-py runs DFlashDraftModel checkpoints only"
        )
        raise ModelError(f"{where}: config.json names architecture {name}; {hint}; use a {ARCHITECTURE} checkpoint")
    dcfg = cfg.get("dflash_config", {})
    if not isinstance(dcfg, dict):
        raise ModelError(f"{where}: config.json's dflash_config is not an object")

    def need(key: str) -> Any:
        value = cfg.get(key)
        if value is None:
            raise ModelError(f"{where}: config.json declares no {key}; the DFlash drafter needs it")
        return value

    try:
        H, heads, layers = int(need("hidden_size")), int(need("num_attention_heads")), int(need("num_hidden_layers"))
        if min(H, heads, int(need("intermediate_size")), int(need("vocab_size"))) < 1:
            raise ValueError("sizes must be positive")
        if not 1 <= layers <= MAX_LAYERS:
            raise ValueError(f"num_hidden_layers {layers} is outside 1..{MAX_LAYERS}")
        n_target = cfg.get("num_target_layers")
        ids = dcfg.get("target_layer_ids")
        if ids is None:
            ids = default_layer_ids(int(n_target or target_layers), layers)
        block = dcfg.get("block_size", cfg.get("block_size"))
        mask = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
        if mask is None:
            raise ModelError(f"{where}: config.json declares no dflash_config.mask_token_id; the block needs it")
        layer_types = cfg.get("layer_types") or ()
        return Spec(
            hidden_size=H,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or H // heads),
            intermediate_size=int(need("intermediate_size")),
            vocab_size=int(need("vocab_size")),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            target_layer_ids=tuple(int(i) for i in ids),
            num_target_layers=int(n_target) if n_target is not None else None,
            mask_token_id=int(mask),
            block_size=int(block) if block is not None else None,
            rope_theta=float(cfg.get("rope_theta", 1_000_000.0)),
            rope_scaling=cfg.get("rope_scaling"),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            sliding_window=int(cfg["sliding_window"]) if cfg.get("sliding_window") else None,
            layer_types=tuple(str(t) for t in layer_types),
            quantization=cfg.get("quantization") if isinstance(cfg.get("quantization"), dict) else None,
        )
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelError(f"{where}: config.json has a malformed DFlash field ({exc})") from None


def check_pair(spec: Spec, target_cfg: dict, folder: Path) -> None:
    """The drafter against its target, from their configs."""
    where = f"--draft-model {folder}"
    tcfg = text_config(target_cfg)
    fix = "use the DFlash drafter made for this target"
    check_sizes(where, fix, {"hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size}, target_cfg)
    n = tcfg.get("num_hidden_layers")
    if isinstance(n, int):
        if spec.num_target_layers is not None and spec.num_target_layers != n:
            raise ModelError(
                f"{where}: the drafter was trained on a {spec.num_target_layers}-layer target "
                f"(num_target_layers), but the target has {n} layers; {fix}"
            )
        bad = [i for i in spec.target_layer_ids if not 0 <= i < n]
        if bad:
            raise ModelError(
                f"{where}: target_layer_ids names layer {bad[0]}, outside the target's {n} layers (0..{n - 1}); {fix}"
            )
    if not spec.target_layer_ids:
        raise ModelError(f"{where}: dflash_config.target_layer_ids is empty; {fix}")
    vocab = tcfg.get("vocab_size")
    if not 0 <= spec.mask_token_id < (vocab if isinstance(vocab, int) else spec.vocab_size):
        raise ModelError(f"{where}: mask_token_id {spec.mask_token_id} is outside the vocabulary; {fix}")


def _name(n: str) -> str:
    return n[len("model.") :] if n.startswith("model.") else n


def check_tensors(spec: Spec, folder: Path) -> dict[str, tuple[Path, str]]:
    """Every tensor the network needs is there with its shape; returns name -> (file, stored name)."""
    where = f"--draft-model {folder}"
    shapes = tensor_shapes(folder)
    if not shapes:
        raise ModelError(f"{where}: no .safetensors weights in the folder")
    found = {_name(n): (f, n, s) for n, (f, s) in shapes.items() if not _name(n).startswith(_IGNORED)}
    want = spec.expected_shapes()
    q = spec.quantization

    def stored_shape(name: str, shape: list[int]) -> list[int]:
        if q and len(shape) == 2 and name.endswith(".weight") and (name[: -len("weight")] + "scales") in found:
            return [shape[0], shape[1] * int(q.get("bits", 4)) // 32]  # packed uint32 words
        return shape

    check_shapes(where, "a DFlash drafter", {n: s for n, (_, _, s) in found.items()}, want, stored_shape)
    extra = [n for n in found if n not in want and not n.endswith((".scales", ".biases"))]
    if extra:
        raise ModelError(f"{where}: tensor {extra[0]} is not part of a DFlash drafter of this config")
    return {n: (f, stored) for n, (f, stored, _) in found.items()}


def load_net(spec: Spec, tensors: dict[str, tuple[Path, str]], folder: Path, target_model: Any) -> DFlashNet:
    """The network with its weights, in the dtype the target's embedding computes in."""
    net = DFlashNet(spec)
    weights = load_named(tensors)
    if spec.quantization:
        q = spec.quantization
        nn.quantize(
            net,
            group_size=int(q.get("group_size", 64)),
            bits=int(q.get("bits", 4)),
            class_predicate=lambda p, m: isinstance(m, nn.Linear) and f"{p}.scales" in weights,
        )
    _, embed = lm_head_and_embed(target_model)
    dtype = embed(mx.array([0])).dtype
    weights = {n: (w.astype(dtype) if mx.issubdtype(w.dtype, mx.floating) else w) for n, w in weights.items()}
    return fit(net, weights, f"--draft-model {folder}: its tensors do not fit the DFlash network")


class DFlashDrafter(Drafter):
    kind = "dflash"

    def __init__(self, net: DFlashNet, target_model: Any, target_vocab: int | None = None):
        self.net = net
        self.hidden_tap = layer_tap(target_model, net.spec.target_layer_ids)  # the target keeps their rows
        self.lm_head, self.embed = lm_head_and_embed(target_model)
        self.mask_id = net.spec.mask_token_id
        self.target_vocab = target_vocab
        self.target = None  # the target's SequenceCache (features of committed positions)
        self.cache = net.make_cache()
        self.base = 0  # the context cache holds positions base..len(ids)-1
        self.ids: list[int] = []  # token ids of positions 0..: what the cached rows stand for

    def begin(self, context: Sequence[int], target: Any = None) -> None:
        if target is not None:
            self.target = target
        keep = common_prefix(self.ids, context[:-1])
        start = self.target.hidden_start if self.target is not None else 0
        if self.base <= keep and start <= keep:  # the rows of a common prefix stay
            drop = len(self.ids) - keep
            if drop:
                for c in self.cache:
                    assert c.trim(drop) == drop
            del self.ids[keep:]
        else:  # the target has no features before `start`: the context restarts there
            self.cache = self.net.make_cache()
            self.base, self.ids = start, list(context[:start])

    def commit(self, context: Sequence[int]) -> None:
        pass  # propose() feeds the accepted positions' features

    def propose(self, context: Sequence[int], limit: int, decider) -> Proposal:
        return self._draft(context, limit, decider, 0)

    def propose_tree(self, context: Sequence[int], limit: int, decider, nodes: int) -> Proposal:
        """The chain and, best first, other paths through the block's per-position top tokens
        (branching.best_first, DDTree)."""
        return self._draft(context, limit, decider, nodes)

    def _draft(self, context: Sequence[int], limit: int, decider, nodes: int) -> Proposal:
        L = len(context)
        first = len(self.ids)  # the first position the context cache lacks; positions run to L-2
        features = self.target.hidden_rows(first, L - 1)[None] if L - 1 > first else None
        self.ids.extend(context[first : L - 1])
        block = self.embed(mx.array([[context[-1]] + [self.mask_id] * limit], dtype=mx.int32))
        out = self.net.draft(block, features, self.cache, base=self.base, start=L - 1)
        self.target.drop_hidden_before(L - 1)  # fed: only the verify's rows are needed from now on
        logits = self.lm_head(out[:, 1:])[0].astype(mx.float32)  # (limit, V): row i drafts x_{L+i}
        picks, rows = [], []
        start = L - decider.prompt_len
        for i in range(limit):
            t, q = draw(logits[i : i + 1], decider, start + i)
            picks.append(t)
            rows += [q] if q is not None else []
        proposal = chain_proposal(picks, rows, self.target_vocab)
        if nodes:
            proposal.tree = best_first(proposal.tokens, logits, nodes, self.tree_margin)
        return proposal


class Source(NetworkSource):
    """assets: the loaded DFlashNet."""

    network = DFlashNet
    drafter = DFlashDrafter


def prepare(draft: DraftConfig, target: loading.ResolvedModel, model_options: Any) -> Plan:
    """Check the checkpoint against the target before any weight loads; the width it declares
    (block_size) is used unless --draft-block-size was given."""
    d = loading.resolve(draft.draft_model, what="--draft-model")
    if not is_dflash(d.config):
        raise ModelError(
            f"--draft-model {draft.draft_model} is not a DFlash drafter (its config.json has neither "
            f"dflash_config nor architectures {ARCHITECTURE}); drop --draft-kind dflash to run it as a "
            f"full-model drafter"
        )
    tcfg = text_config(target.config)
    spec = read_spec(d.config, d.path, int(tcfg.get("num_hidden_layers") or 0))
    check_pair(spec, target.config, d.path)
    tensors = check_tensors(spec, d.path)
    if not draft.block_explicit and spec.block_size:
        draft = replace(draft, block_size=spec.block_size)
    if draft.block_size < 2:
        raise ModelError(
            f"--draft-model {d.path}: a DFlash block of {draft.block_size} drafts nothing (its first row is "
            f"the last committed token); pass --draft-block-size 2 or more"
        )

    def load(loaded: loading.LoadedModel, say) -> Source:
        net = load_net(spec, tensors, d.path, loaded.model)
        say(
            f"DFlash drafter: {spec.num_hidden_layers} layer(s), taps target layers "
            f"{list(spec.target_layer_ids)}, from {d.path}"
        )
        return Source.of(draft, loaded, net)

    return Plan(draft, load)

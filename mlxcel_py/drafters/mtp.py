"""The MTP drafter: a Qwen3.5 / Qwen3-Next checkpoint's own multi-token-prediction head.

mlx-lm drops the `mtp.*` tensors at load (`sanitize`), so they are read here from the same
safetensors files, or from a separate `qwen3_5_mtp` checkpoint given as --draft-model. The head:
    h = fc([pre_fc_norm_embedding(embed(x_{t+1})); pre_fc_norm_hidden(h_t)])   (2H -> H)
    h = decoder layer(s) of the trunk's full-attention kind;  out = norm(h);  logits = lm_head(out)
with the target's embedding and lm_head shared. h_t is the target's last hidden state (after its
final norm, the input of its lm_head) at position t, x_{t+1} the token that followed it.

Drafting a round for history x_0..x_{L-1}: the head's cache holds one entry per committed pair
(h_j, x_{j+1}); the pairs not yet fed (real target hidden states, kept by the target's
SequenceCache for the positions it committed) go in one block, whose last row drafts x_L; later
drafts feed the head's own output back in. The next round trims those self-fed entries and feeds
the real hidden states of what the target accepted instead, so the head never drifts. Every draft
is verified by the shared verify round, so output equals plain decoding whatever the head says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelError
from ..models import loading
from ..models.config import text_config
from ..models.families import with_mtp_heads
from ..models.safetensors import load_named, load_tensors, tensor_shapes
from ..models.taps import hidden_tap, lm_head_and_embed, text_model
from ..options import DraftConfig
from .base import (  # one sampling rule for every model drafter
    Drafter,
    DrafterSource,
    Plan,
    Proposal,
    chain_proposal,
    draw,
)
from .branching import runner_ups
from .checkpoints import fit

FAMILIES = with_mtp_heads()
_NORMS = ("norm.weight", "layernorm.weight")  # every RMSNorm weight of the head ends so


def head_name(name: str) -> str | None:
    """'model.mtp.fc.weight' / 'mtp.fc.weight' -> 'fc.weight'; None for trunk tensors."""
    i = name.find("mtp.")
    return name[i + 4 :] if i >= 0 and (i == 0 or name[i - 1] == ".") else None


@dataclass(frozen=True)
class HeadSource:
    """Where the head's tensors are, and the width its checkpoint declares (None: not declared)."""

    folder: Path
    config: dict  # the text config the head's layer is built from (gemma4_assistant: its config)
    tensors: dict  # head name -> (file, original name)
    declared_width: int | None
    where: str  # human text for the startup line
    family: str = "qwen"  # "qwen" (mtp.* tensors) | "gemma4_assistant"


def find_head(
    target_cfg: dict, target_folder: Path, draft_cfg: dict | None = None, draft_folder: Path | None = None
) -> HeadSource:
    """Config- and header-level checks, before any weight loads; the refusals name the reason."""
    tcfg = text_config(target_cfg)
    if draft_cfg is not None and draft_cfg.get("model_type") == "gemma4_assistant":
        from . import gemma4_assistant

        where = f"--draft-model {draft_folder}"
        gemma4_assistant.check_target(target_cfg, draft_cfg, where)
        width = draft_cfg.get("block_size") or _generation_width(draft_folder)
        tensors = {n: (f, n) for n, (f, _) in tensor_shapes(draft_folder).items()}
        return HeadSource(draft_folder, draft_cfg, tensors, width, where, family="gemma4_assistant")
    if target_cfg.get("model_type") not in FAMILIES:
        raise ModelError(
            f"--draft-kind mtp: the target is a {target_cfg.get('model_type')} model, which has no "
            f"multi-token-prediction head (MTP heads ship with {', '.join(FAMILIES)} checkpoints); "
            f"use --prompt-lookup or --draft-model instead"
        )
    folder, cfg = (draft_folder, text_config(draft_cfg or {})) if draft_folder is not None else (target_folder, tcfg)
    where = f"--draft-model {draft_folder}" if draft_folder is not None else f"the target checkpoint {target_folder}"
    if draft_folder is not None:
        for key in ("hidden_size", "vocab_size"):
            if cfg.get(key) is not None and cfg.get(key) != tcfg.get(key):
                raise ModelError(
                    f"--draft-model {draft_folder}: the MTP head's {key} ({cfg.get(key)}) does not match "
                    f"the target's ({tcfg.get(key)}); use the head made for this target"
                )
        cfg = {**tcfg, **{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")}}
    elif not tcfg.get("mtp_num_hidden_layers", 1):
        raise ModelError(f"--draft-kind mtp: {where} declares mtp_num_hidden_layers = 0, so it has no MTP head")
    shapes = tensor_shapes(folder)
    tensors = {h: (f, name) for name, (f, _) in shapes.items() if (h := head_name(name)) is not None}
    if draft_folder is not None and not tensors:  # a head-only checkpoint may store unprefixed names
        tensors = {name: (f, name) for name, (f, _) in shapes.items()}
    if "fc.weight" not in tensors:
        raise ModelError(
            f"--draft-kind mtp: {where} has no MTP head (no mtp.fc tensor in its safetensors; "
            f"mlx-community conversions drop it); pass the original checkpoint, or the head as "
            f"--draft-model DIR"
        )
    hidden = tcfg.get("hidden_size")
    fc_shape = next(s for n, (_, s) in shapes.items() if n == tensors["fc.weight"][1])
    if fc_shape != [hidden, 2 * hidden]:
        raise ModelError(
            f"--draft-kind mtp: the MTP head in {where} maps {fc_shape[1] if len(fc_shape) == 2 else '?'} "
            f"inputs to {fc_shape[0] if fc_shape else '?'}, but the target's hidden size is {hidden} "
            f"(expected {2 * hidden} -> {hidden}); use the head made for this target"
        )
    width = next(
        (
            cfg[k]
            for k in ("block_size", "num_speculative_tokens", "num_nextn_predict_layers_width")
            if isinstance(cfg.get(k), int) and cfg[k] > 0
        ),
        None,
    )
    return HeadSource(folder, cfg, tensors, width, where)


def _generation_width(folder: Path) -> int | None:
    """An assistant checkpoint may declare its width as generation_config.json's num_assistant_tokens."""
    try:
        n = json.loads((folder / "generation_config.json").read_text()).get("num_assistant_tokens")
    except (OSError, ValueError, AttributeError):
        return None
    return n if isinstance(n, int) and n > 0 else None


# ---- the head ------------------------------------------------------------------------------------
def _layer_class(model_type: str):
    if model_type == "qwen3_next":
        from mlx_lm.models.qwen3_next import ModelArgs, Qwen3NextDecoderLayer

        return ModelArgs, Qwen3NextDecoderLayer
    from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

    return TextModelArgs, DecoderLayer


class MTPHead(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        args_cls, layer_cls = _layer_class(cfg.get("model_type", "qwen3_5"))
        args = args_cls.from_dict(cfg)
        H, eps = args.hidden_size, args.rms_norm_eps
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(H, eps=eps)
        # full attention: the layer index the trunk gives its attention layers
        n = int(cfg.get("mtp_num_hidden_layers", 1) or 1)
        self.layers = [layer_cls(args, args.full_attention_interval - 1) for _ in range(n)]
        self.norm = nn.RMSNorm(H, eps=eps)

    def __call__(self, embedded: mx.array, hidden: mx.array, cache: list) -> mx.array:
        from mlx_lm.models.base import create_attention_mask

        h = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], axis=-1))
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask=mask, cache=c)
        return self.norm(h)

    def make_cache(self) -> list:
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in self.layers]

    def drafter(self, target_model: Any, target_vocab: int | None) -> MtpDrafter:
        return MtpDrafter(self, target_model, target_vocab)


def _norm_offset(model: Any, target_folder: Path) -> float:
    """mlx-lm adds 1 to the trunk's RMSNorm weights when the checkpoint stores them zero-centred;
    the head's are stored the same way, so they get what the trunk got (measured on the final
    norm: loaded weight minus stored weight)."""
    shapes = tensor_shapes(target_folder)
    stored = next((n for n in shapes if n.endswith("model.norm.weight") and head_name(n) is None), None)
    if stored is None:
        return 0.0
    raw = load_tensors(shapes[stored][0])[stored].astype(mx.float32)
    loaded = text_model(model)[1].norm.weight.astype(mx.float32)
    return 1.0 if abs(mx.mean(loaded - raw).item() - 1.0) < 1e-3 else 0.0


def load_head(model: Any, source: HeadSource, target_folder: Path):
    """The drafter head of `source` with weights, ready for `head.drafter(target, vocab)`."""
    if source.family == "gemma4_assistant":
        from . import gemma4_assistant

        return gemma4_assistant.load(source.folder, source.config, model)
    head = MTPHead(source.config)
    weights = load_named(source.tensors)
    offset = _norm_offset(model, target_folder)
    dtype = lm_head_and_embed(model)[1].weight.dtype
    for name, w in list(weights.items()):
        if offset and w.ndim == 1 and name.endswith(_NORMS):
            w = w.astype(mx.float32) + offset
        weights[name] = w.astype(dtype)
    return fit(
        head, weights, f"the MTP head in {source.where} does not fit a {source.config.get('model_type')} decoder layer"
    )


# ---- the drafter ---------------------------------------------------------------------------------
class MtpDrafter(Drafter):
    kind = "mtp"

    def __init__(self, head: MTPHead, target_model: Any, target_vocab: int | None = None):
        self.head = head
        self.hidden_tap = hidden_tap(target_model)  # the target keeps its last hidden states for the head
        self.lm_head, self.embed = lm_head_and_embed(target_model)
        self.target_vocab = target_vocab
        self.target = None  # the target's SequenceCache (hidden states of committed positions)
        self.cache = head.make_cache()
        self.tokens: list[int] = []  # x_{j+1} of every real pair (h_j, x_{j+1}) in the cache, j = base..
        self.base = 0  # position j of the first pair
        self._self_fed = 0  # entries after the real ones, fed from the head's own drafts

    def begin(self, context: Sequence[int], target=None) -> None:
        if target is not None:
            self.target = target
        # start over: the target's hidden states of earlier requests are gone
        self.cache = self.head.make_cache()
        self.tokens, self._self_fed = [], 0
        self.base = self.target.hidden_start if self.target is not None else 0

    def commit(self, context: Sequence[int]) -> None:
        pass  # propose() feeds the accepted positions' real hidden states

    def _trim_self_fed(self) -> None:
        if self._self_fed:
            for c in self.cache:
                got = c.trim(self._self_fed)
                assert got == self._self_fed, f"MTP cache rollback trimmed {got} of {self._self_fed}"
            self._self_fed = 0

    def propose(self, context: Sequence[int], limit: int, decider):
        return self._draft(context, limit, decider, False)

    def propose_tree(self, context: Sequence[int], limit: int, decider, nodes: int):
        """The chain, with each step's runner-up beside it (branching.runner_ups; mlxcel's MTP tree)."""
        return self._draft(context, limit, decider, True)

    def _draft(self, context: Sequence[int], limit: int, decider, branch: bool):
        self._trim_self_fed()
        L = len(context)
        if L < 2:  # the target has no hidden state yet (a one-token prompt)
            return Proposal([])
        first = self.base + len(self.tokens)  # next pair j to feed; pairs run to j = L - 2
        hidden = self.target.hidden_rows(first, L - 1)  # h_first .. h_{L-2}
        new = list(context[first + 1 : L])
        emb = self.embed(mx.array([new], dtype=mx.int32))
        out = self.head(emb, hidden[None], self.cache)[:, -1:]
        self.tokens.extend(new)
        self.target.drop_hidden_before(L - 1)  # fed: only the verify's rows are needed from now on
        picks, rows, steps = [], [], []
        start = L - decider.prompt_len
        for i in range(limit):
            logits = self.lm_head(out)[0].astype(mx.float32)
            t, q = draw(logits, decider, start + i)
            picks.append(t)
            rows += [q] if q is not None else []
            steps += [logits] if branch else []
            if i + 1 < limit:
                out = self.head(self.embed(t.reshape(1, 1)), out, self.cache)
                self._self_fed += 1
        proposal = chain_proposal(picks, rows, self.target_vocab)
        if branch:
            proposal.tree = runner_ups(proposal.tokens, steps, self.tree_margin)
        return proposal


class Source(DrafterSource):
    """assets: the loaded head (an MTPHead or a Gemma 4 assistant), whose `drafter()` drafts for
    the target model."""

    shares_drafter = True

    def __init__(self, draft: DraftConfig, **kw):
        super().__init__(draft, **kw)
        if self.assets is None:
            raise ValueError("the mtp drafter needs its loaded head (assets)")
        self.head = self.assets

    def new_drafter(self) -> Drafter:
        return self.head.drafter(self.model, self.vocab_size)

    def warm(self, tokens: Sequence[int]) -> None:
        self.warm_tapped(tokens, self.config.block_size)


def prepare(draft: DraftConfig, target: loading.ResolvedModel, model_options: Any) -> Plan:
    """Find the head (the target's own, or --draft-model DIR) before any weight loads; a width the
    checkpoint declares is used unless --draft-block-size was given."""
    folder = cfg = None
    if draft.draft_model:
        d = loading.resolve(draft.draft_model, what="--draft-model")
        folder, cfg = d.path, d.config
    source = find_head(target.config, target.path, cfg, folder)
    if not draft.block_explicit and source.declared_width:
        draft = replace(draft, block_size=source.declared_width)

    def load(loaded: loading.LoadedModel, say) -> Source:
        head = load_head(loaded.model, source, target.path)
        say(f"MTP head: {len(source.tensors)} tensors from {source.where}")
        return Source.of(draft, loaded, head)

    return Plan(draft, load)

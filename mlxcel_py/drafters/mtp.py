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
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn

from .base import Proposal, chain_proposal, draw  # one sampling rule for every model drafter
from ..errors import ModelError

FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
MTP_CHECKPOINT_TYPES = ("qwen3_5_mtp", "qwen3_next_mtp", "gemma4_assistant")
DEFAULT_WIDTH = 4
_NORMS = ("norm.weight", "layernorm.weight")  # every RMSNorm weight of the head ends so


# ---- what a checkpoint holds, read from safetensors headers (no tensor data) --------------------
def tensor_shapes(folder: Path) -> dict[str, tuple[Path, list[int]]]:
    """name -> (file, shape) for every tensor in the folder's safetensors files."""
    out: dict[str, tuple[Path, list[int]]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                # the header is JSON of at most 100 MB (the format's own limit) inside the file
                if n > min(100 << 20, f.stat().st_size - 8):
                    raise ValueError("header length out of range")
                header = json.loads(fh.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (OSError, struct.error, ValueError):
            raise ModelError(f"{f}: not a readable safetensors file") from None
        for name, meta in header.items():
            if name != "__metadata__" and isinstance(meta, dict):
                out[name] = (f, list(meta.get("shape", [])))
    return out


def load_tensors(f: Path) -> dict[str, mx.array]:
    """All tensors of one safetensors file; a damaged file is a one-line error, not a traceback."""
    try:
        return mx.load(str(f))
    except (OSError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{f}: cannot read its tensors ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None


def head_name(name: str) -> str | None:
    """'model.mtp.fc.weight' / 'mtp.fc.weight' -> 'fc.weight'; None for trunk tensors."""
    i = name.find("mtp.")
    return name[i + 4 :] if i >= 0 and (i == 0 or name[i - 1] == ".") else None


def text_config(cfg: dict) -> dict:
    """A flat text config (Qwen3.5 nests it under text_config)."""
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else dict(cfg)


def is_mtp_checkpoint(cfg: dict) -> bool:
    return cfg.get("model_type") in MTP_CHECKPOINT_TYPES


@dataclass(frozen=True)
class HeadSource:
    """Where the head's tensors are, and the width its checkpoint declares (None: not declared)."""

    folder: Path
    config: dict  # the text config the head's layer is built from (gemma4_assistant: its config)
    tensors: dict  # head name -> (file, original name)
    declared_width: int | None
    where: str  # human text for the startup line
    family: str = "qwen"  # "qwen" (mtp.* tensors) | "gemma4_assistant"


def find_head(target_cfg: dict, target_folder: Path, draft_cfg: dict | None = None,
              draft_folder: Path | None = None) -> HeadSource:
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
        raise ModelError(f"--draft-kind mtp: the target is a {target_cfg.get('model_type')} model, which has no "
                         f"multi-token-prediction head (MTP heads ship with {', '.join(FAMILIES)} checkpoints); "
                         f"use --prompt-lookup or --draft-model instead")
    folder, cfg = (draft_folder, text_config(draft_cfg or {})) if draft_folder is not None else (target_folder, tcfg)
    where = f"--draft-model {draft_folder}" if draft_folder is not None else f"the target checkpoint {target_folder}"
    if draft_folder is not None:
        for key in ("hidden_size", "vocab_size"):
            if cfg.get(key) is not None and cfg.get(key) != tcfg.get(key):
                raise ModelError(f"--draft-model {draft_folder}: the MTP head's {key} ({cfg.get(key)}) does not match "
                                 f"the target's ({tcfg.get(key)}); use the head made for this target")
        cfg = {**tcfg, **{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")}}
    elif not tcfg.get("mtp_num_hidden_layers", 1):
        raise ModelError(f"--draft-kind mtp: {where} declares mtp_num_hidden_layers = 0, so it has no MTP head")
    shapes = tensor_shapes(folder)
    tensors = {h: (f, name) for name, (f, _) in shapes.items() if (h := head_name(name)) is not None}
    if draft_folder is not None and not tensors:  # a head-only checkpoint may store unprefixed names
        tensors = {name: (f, name) for name, (f, _) in shapes.items()}
    if "fc.weight" not in tensors:
        raise ModelError(f"--draft-kind mtp: {where} has no MTP head (no mtp.fc tensor in its safetensors; "
                         f"mlx-community conversions drop it); pass the original checkpoint, or the head as "
                         f"--draft-model DIR")
    hidden = tcfg.get("hidden_size")
    fc_shape = next(s for n, (_, s) in shapes.items() if n == tensors["fc.weight"][1])
    if fc_shape != [hidden, 2 * hidden]:
        raise ModelError(f"--draft-kind mtp: the MTP head in {where} maps {fc_shape[1] if len(fc_shape) == 2 else '?'} "
                         f"inputs to {fc_shape[0] if fc_shape else '?'}, but the target's hidden size is {hidden} "
                         f"(expected {2 * hidden} -> {hidden}); use the head made for this target")
    width = next((cfg[k] for k in ("block_size", "num_speculative_tokens", "num_nextn_predict_layers_width")
                  if isinstance(cfg.get(k), int) and cfg[k] > 0), None)
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

    def drafter(self, target_model: Any, target_vocab: int | None) -> "MTPDrafter":
        return MTPDrafter(self, target_model, target_vocab)


def text_model(model: Any) -> tuple[Any, Any]:
    """(language model, its inner text model): Qwen3.5 and Gemma 4 wrap the text model."""
    lm = getattr(model, "language_model", model)
    return lm, lm.model


def lm_head_and_embed(model: Any) -> tuple[Callable[[mx.array], mx.array], Any]:
    """The target's lm_head (as its forward applies it, before any softcap) and embed_tokens."""
    lm, inner = text_model(model)
    tied = getattr(getattr(lm, "args", None), "tie_word_embeddings", True)
    return (inner.embed_tokens.as_linear if tied else lm.lm_head), inner.embed_tokens


class HiddenTap:
    """Holds the output of a model's final norm (its last hidden states) from the latest forward."""

    last: mx.array | None = None


_RECORDING: dict[type, type] = {}


def hidden_tap(model: Any) -> HiddenTap:
    """Make the model's final norm record its output (the input of its lm_head): the forward
    itself is untouched, so logits stay exactly what plain decoding computes."""
    _, inner = text_model(model)
    norm = inner.norm
    tap = getattr(norm, "_mlxcel_tap", None)
    if tap is None:
        base = type(norm)
        if base not in _RECORDING:
            def call(self, x, _base=base):
                out = _base.__call__(self, x)
                self._mlxcel_tap.last = out
                return out

            _RECORDING[base] = type(f"Recording{base.__name__}", (base,), {"__call__": call})
        tap = HiddenTap()
        norm._mlxcel_tap = tap  # a plain object: MLX keeps it out of the parameters
        norm.__class__ = _RECORDING[base]
    return tap


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
    files: dict[Path, dict] = {}
    weights = {}
    for name, (f, original) in source.tensors.items():
        if f not in files:
            files[f] = load_tensors(f)
        weights[name] = files[f][original]
    offset = _norm_offset(model, target_folder)
    dtype = lm_head_and_embed(model)[1].weight.dtype
    for name, w in list(weights.items()):
        if offset and w.ndim == 1 and name.endswith(_NORMS):
            w = w.astype(mx.float32) + offset
        weights[name] = w.astype(dtype)
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelError(f"the MTP head in {source.where} does not fit a {source.config.get('model_type')} "
                         f"decoder layer: {str(exc).splitlines()[0]}") from None
    mx.eval(head.parameters())
    return head


# ---- the drafter ---------------------------------------------------------------------------------
class MTPDrafter:
    kind = "mtp"

    def __init__(self, head: MTPHead, target_model: Any, target_vocab: int | None = None):
        self.head = head
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

    def shadow(self, limit: int) -> list[int]:
        return []

    def _trim_self_fed(self) -> None:
        if self._self_fed:
            for c in self.cache:
                got = c.trim(self._self_fed)
                assert got == self._self_fed, f"MTP cache rollback trimmed {got} of {self._self_fed}"
            self._self_fed = 0

    def propose(self, context: Sequence[int], limit: int, decider):
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
        picks, rows = [], []
        start = L - decider.prompt_len
        for i in range(limit):
            logits = self.lm_head(out)[0].astype(mx.float32)
            t, q = draw(logits, decider, start + i)
            picks.append(t)
            rows += [q] if q is not None else []
            if i + 1 < limit:
                out = self.head(self.embed(t.reshape(1, 1)), out, self.cache)
                self._self_fed += 1
        return chain_proposal(picks, rows, self.target_vocab)

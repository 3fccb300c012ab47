"""The EAGLE-3 drafter (`--draft-kind eagle3`, or an EAGLE-3 folder as --draft-model): a one-layer
feature drafter (eagle3_net.py) that reads the target's residual stream at three depths.

Round for history x_0..x_{L-1}, as the MTP head's: the drafter's cache holds one entry per
committed pair (target features f_j, token x_{j+1}); the pairs not fed yet (the target's tapped
rows of the positions it committed since the last round) go in one causal block, whose last row
drafts x_L; later drafts feed the drafter's own output back with the token it drafted. The next
round trims those self-fed entries and feeds the target's real features of what was accepted, so
the drafter never drifts. Draft logits cover the checkpoint's draft vocabulary; they are placed
at their target ids (d + d2t[d]) with every other target token impossible, so greedy drafts are
the mapped argmax and sampled drafts come from that distribution q (q = 0 off the mapped set),
which the verifier's lossless p/q rule uses.

Layer ids follow vLLM's convention (id j = the residual stream before target layer j, i.e. the
output of layer j-1); the default is vLLM's (2, N/2, N-3). Two layouts load: EAGLE's own
(`LlamaForCausalLMEagle3`, tensors `midlayer.*`) and vLLM speculators' (`Eagle3Speculator`, a
`transformer_layer_config`, tensors `layers.0.*`). Before any weight loads `prepare` checks the
checkpoint against the target: hidden size, vocabulary, tapped layers, every tensor's shape, and
that `d2t` maps inside the target's vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import ModelError
from ..models import loading
from ..models.config import text_config
from ..models.safetensors import load_named, load_tensors, tensor_shapes
from ..models.taps import layer_tap, lm_head_and_embed
from ..options import DraftConfig
from .base import Drafter, NetworkSource, Plan, Proposal, chain_proposal, draw
from .branching import runner_ups
from .checkpoints import check_card, check_shapes, check_sizes, fit
from .eagle3_net import Eagle3Net, Spec
from .registry import is_eagle3_checkpoint as is_eagle3


def default_aux_ids(n: int) -> tuple[int, ...]:
    """vLLM's default taps for an N-layer target: low, middle, high."""
    return (2, n // 2, n - 3)


def _stored(name: str) -> str:
    """A checkpoint's tensor name in this module's terms (both layouts, an optional model. prefix)."""
    name = name[len("model.") :] if name.startswith("model.") else name
    return "midlayer." + name[len("layers.0.") :] if name.startswith("layers.0.") else name


def read_spec(cfg: dict, folder: Path, target_layers: int, has_embedding: bool = False) -> Spec:
    where = f"--draft-model {folder}"
    layer = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else cfg
    eagle = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}

    def need(key: str) -> Any:
        value = layer.get(key, cfg.get(key))
        if value is None:
            raise ModelError(f"{where}: config.json declares no {key}; the EAGLE-3 drafter needs it")
        return value

    try:
        n_layers = int(layer.get("num_hidden_layers", 1))
        if n_layers != 1:
            raise ModelError(f"{where}: an EAGLE-3 drafter has one decoder layer; config.json declares {n_layers}")
        H, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        vocab = int(need("vocab_size"))
        if min(H, heads, vocab, int(need("intermediate_size"))) < 1:
            raise ValueError("sizes must be positive")
        ids = cfg.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        target_hidden = cfg.get("target_hidden_size")
        if target_hidden is not None and int(target_hidden) != H:
            raise ModelError(
                f"{where}: the drafter's hidden size ({H}) differs from the one it reads (target_hidden_size "
                f"{target_hidden}); mlxcel-py runs drafters of the target's own width"
            )
        return Spec(
            hidden_size=H,
            num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or H // heads),
            intermediate_size=int(need("intermediate_size")),
            vocab_size=vocab,
            draft_vocab_size=int(cfg.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-5)),
            aux_layer_ids=tuple(int(i) for i in ids) if ids else default_aux_ids(target_layers),
            rope_theta=float(layer.get("rope_theta", 500_000.0)),
            rope_scaling=layer.get("rope_scaling"),
            max_position_embeddings=int(layer.get("max_position_embeddings", 8192)),
            attention_bias=bool(layer.get("attention_bias", False)),
            norm_before_residual=bool(cfg.get("norm_before_residual", layer.get("norm_before_residual", False))),
            has_embedding=has_embedding,
        )
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelError(f"{where}: config.json has a malformed EAGLE-3 field ({exc})") from None


def declared_width(cfg: dict) -> int | None:
    spec = cfg.get("speculators_config") if isinstance(cfg.get("speculators_config"), dict) else {}
    for value in (spec.get("num_speculative_tokens"), cfg.get("num_speculative_tokens"), cfg.get("block_size")):
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_pair(spec: Spec, target_cfg: dict, folder: Path) -> None:
    where = f"--draft-model {folder}"
    tcfg = text_config(target_cfg)
    fix = "use the EAGLE-3 drafter made for this target"
    check_sizes(where, fix, {"hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size}, target_cfg)
    if spec.draft_vocab_size > spec.vocab_size:
        raise ModelError(
            f"{where}: draft_vocab_size ({spec.draft_vocab_size}) is larger than the vocabulary ({spec.vocab_size})"
        )
    n = tcfg.get("num_hidden_layers")
    if isinstance(n, int):
        bad = [j for j in spec.aux_layer_ids if not 1 <= j <= n]
        if bad:
            what = "the embedding output, which mlxcel-py does not tap" if bad[0] == 0 else f"outside 1..{n}"
            raise ModelError(
                f"{where}: eagle_aux_hidden_state_layer_ids names {bad[0]} ({what}; id j is the hidden "
                f"state before target layer j of {n}); {fix}"
            )


def check_tensors(spec: Spec, folder: Path) -> tuple[dict[str, tuple[Path, str]], mx.array | None]:
    """name -> (file, stored name) of every tensor the network needs, checked for shape; and the
    checkpoint's d2t (None: the draft vocabulary is the target's, in order)."""
    where = f"--draft-model {folder}"
    shapes = tensor_shapes(folder)
    if not shapes:
        raise ModelError(f"{where}: no .safetensors weights in the folder")
    found = {_stored(n): (f, n, s) for n, (f, s) in shapes.items()}
    want = spec.expected_shapes()
    check_shapes(where, "an EAGLE-3 drafter", {n: s for n, (_, _, s) in found.items()}, want)
    d2t = None
    if "d2t" in found:
        f, stored, shape = found["d2t"]
        if list(shape) != [spec.draft_vocab_size]:
            raise ModelError(f"{where}: tensor d2t has shape {list(shape)}, expected [{spec.draft_vocab_size}]")
        d2t = load_tensors(f)[stored].astype(mx.int64)
        mapped = mx.arange(spec.draft_vocab_size, dtype=mx.int64) + d2t
        lo, hi = mx.min(mapped).item(), mx.max(mapped).item()
        if lo < 0 or hi >= spec.vocab_size:
            raise ModelError(
                f"{where}: d2t maps draft ids to target id {lo if lo < 0 else hi}, outside the target's "
                f"vocabulary (0..{spec.vocab_size - 1}); the file is damaged or made for another target"
            )
        if len(set(mapped.tolist())) != spec.draft_vocab_size:
            raise ModelError(f"{where}: d2t maps two draft ids to the same target id; the file is damaged")
    elif spec.draft_vocab_size != spec.vocab_size:
        raise ModelError(
            f"{where}: the draft vocabulary ({spec.draft_vocab_size}) is smaller than the target's, but the "
            f"checkpoint has no d2t tensor mapping it"
        )
    return {n: (f, stored) for n, (f, stored, _) in found.items() if n in want}, d2t


def load_net(spec: Spec, tensors: dict, d2t: mx.array | None, folder: Path, target_model: Any) -> Eagle3Net:
    net = Eagle3Net(spec)
    weights = load_named(tensors)
    _, embed = lm_head_and_embed(target_model)
    dtype = embed(mx.array([0])).dtype
    weights = {n: w.astype(dtype) for n, w in weights.items()}
    weights["d2t"] = (d2t if d2t is not None else mx.zeros((spec.draft_vocab_size,))).astype(mx.int32)
    net = fit(net, weights, f"--draft-model {folder}: its tensors do not fit the EAGLE-3 network")
    return on_the_kernel(net)


DRAFT_BITS = "q4"  # MLXCEL_DRAFT_BITS=q8 for A/B runs


def on_the_kernel(net: Eagle3Net) -> Eagle3Net:
    """The drafter's layers in 4 bits on the row-exact kernel where it built, and its midlayer as
    one op (eagle3_kernel.py). Between two target forwards (92 MB of weights streamed) the
    drafter's own weights are out of the caches, so a draft step is bound by reading them; its
    precision only moves acceptance, never the output (every token is the target's). Measured
    with the default model's trained drafter (12 prose prompts, one interleaved run each): q8 ->
    q4 took a round's drafting 0.53 -> 0.41 ms and the speedup 1.07x -> 1.12-1.14x, acceptance
    35% -> 36%; earlier, float32 on BLAS -> q8 took it 9.2 -> 3.5 ms. MLXCEL_NO_FUSED_LAYERS=1
    keeps the MLX layer code (A/B)."""
    from ..cpu import weights as cpu_weights
    from ..cpu.extension import kernel_status
    from . import eagle3_kernel

    qmm, _ = kernel_status()
    if qmm is not None:
        bits = os.environ.get("MLXCEL_DRAFT_BITS") or DRAFT_BITS
        if bits not in ("q4", "q8"):
            raise ModelError(f"MLXCEL_DRAFT_BITS={bits}: the drafter's weights are q4 (the default) or q8")
        cpu_weights.apply(net, bits)
        if not os.environ.get("MLXCEL_NO_FUSED_LAYERS"):
            net.fused = eagle3_kernel.fuse(net)
    return net


class Eagle3Drafter(Drafter):
    kind = "eagle3"
    # At most CATCH_UP unseen positions are fed before a draft; beyond it the drafter's cache keeps
    # its first SINK entries (the attention sink: the chat template's opening) and takes the newest
    # CATCH_UP next to them (rope is relative: the tail attends as it stood). Feeding is a multi-row
    # forward, compute-bound here (~25 us a row): a composite whose lookup side just took 100
    # tokens, or a long prompt, cost a model round milliseconds (measured: composite code replies
    # 1.33x plain against lookup's 1.49x; 1.51x with the cap). On 12 prose prompts the cap with
    # the sink drafted as well as feeding everything (0.41-0.42 tokens a round both), without
    # the sink a little worse (0.39-0.40).
    CATCH_UP = 32
    SINK = 4
    hidden_window = CATCH_UP + 8  # the target keeps no more of its tap rows than a catch-up reads

    def __init__(self, net: Eagle3Net, target_model: Any, target_vocab: int | None = None):
        self.net = net
        # id j reads the residual stream before layer j: layer j-1's output
        self.hidden_tap = layer_tap(target_model, [j - 1 for j in net.spec.aux_layer_ids])
        _, target_embed = lm_head_and_embed(target_model)
        self.embed = net.embed_tokens if net.spec.has_embedding else target_embed
        self.mapped = net.target_ids()  # target id of each draft id
        self.vocab = target_vocab or net.spec.vocab_size
        self.target = None
        self.cache = net.make_cache()
        self.tokens: list[int] = []  # x_{j+1} of every real pair (f_j, x_{j+1}) in the cache, j = base..
        self.base = 0
        self._self_fed = 0

    def begin(self, context: Sequence[int], target: Any = None) -> None:
        if target is not None:
            self.target = target
        self.cache = self.net.make_cache()
        self.tokens, self._self_fed = [], 0
        self.base = self.target.hidden_start if self.target is not None else 0

    def commit(self, context: Sequence[int]) -> None:
        pass  # propose() feeds the accepted positions' features

    def _trim_self_fed(self) -> None:
        if self._self_fed:
            got = self.cache[0].trim(self._self_fed)
            assert got == self._self_fed, f"EAGLE-3 cache rollback trimmed {got} of {self._self_fed}"
            self._self_fed = 0

    def _target_logits(self, draft_logits: mx.array) -> mx.array:
        """Draft-vocabulary logits (1, Vd) at their target ids; -inf for every other target token."""
        full = mx.full((1, self.vocab), -mx.inf, dtype=mx.float32)
        return mx.put_along_axis(full, self.mapped[None], draft_logits.astype(mx.float32), axis=-1)

    def propose(self, context: Sequence[int], limit: int, decider) -> Proposal:
        return self._draft(context, limit, decider, False)

    def propose_tree(self, context: Sequence[int], limit: int, decider, nodes: int) -> Proposal:
        """The chain, with each step's runner-up beside it (branching.runner_ups)."""
        return self._draft(context, limit, decider, True)

    def _draft(self, context: Sequence[int], limit: int, decider, branch: bool) -> Proposal:
        self._trim_self_fed()
        L = len(context)
        if L < 2:  # the target has no features yet (a one-token prompt)
            return Proposal([])
        first = self.base + len(self.tokens)  # next pair j to feed; pairs run to j = L - 2
        if L - 1 - first > self.CATCH_UP:  # a long stretch unseen: keep the first entries, then its tail
            kv = self.cache[0]
            if kv.offset > self.SINK:
                kv.trim(kv.offset - self.SINK)
            else:
                self.cache = self.net.make_cache()
            self.tokens = []
            first = self.base = L - 1 - self.CATCH_UP
        hidden = self.net.features(self.target.hidden_rows(first, L - 1)[None])
        new = list(context[first + 1 : L])
        logits, out = self.net.step(self.embed(mx.array([new], dtype=mx.int32)), hidden, self.cache, last_only=True)
        self.tokens.extend(new)
        self.target.drop_hidden_before(L - 1)
        picks, rows, steps = [], [], []
        start = L - decider.prompt_len
        quick = decider.greedy and not branch  # the mapped argmax, without spreading logits over the vocabulary
        for i in range(limit):
            if quick:
                t, q = self.mapped[mx.argmax(logits[0], axis=-1)], None
            else:
                target_logits = self._target_logits(logits[0])
                t, q = draw(target_logits, decider, start + i)
            picks.append(t)
            rows += [q] if q is not None else []
            steps += [target_logits] if branch else []
            if i + 1 < limit:
                logits, out = self.net.step(self.embed(t.reshape(1, 1)), out, self.cache)
                self._self_fed += 1
        proposal = chain_proposal(picks, rows, self.vocab)
        if branch:
            proposal.tree = runner_ups(proposal.tokens, steps, self.tree_margin)
        return proposal


class Source(NetworkSource):
    """assets: the loaded Eagle3Net."""

    network = Eagle3Net
    drafter = Eagle3Drafter


def prepare(draft: DraftConfig, target: loading.ResolvedModel, model_options: Any) -> Plan:
    """Check the checkpoint against the target before any weight loads; a width it declares
    (speculators' num_speculative_tokens) is used unless --draft-block-size was given."""
    d = loading.resolve(draft.draft_model, what="--draft-model")
    if not is_eagle3(d.config):
        raise ModelError(
            f"--draft-model {draft.draft_model} is not an EAGLE-3 drafter (its config.json names no Eagle3 "
            f"architecture); drop --draft-kind eagle3 to run it as a full-model drafter"
        )
    check_card(f"--draft-model {draft.draft_model}", d.path, target)
    tcfg = text_config(target.config)
    has_embedding = any(_stored(n) == "embed_tokens.weight" for n in tensor_shapes(d.path))
    spec = read_spec(d.config, d.path, int(tcfg.get("num_hidden_layers") or 0), has_embedding)
    check_pair(spec, target.config, d.path)
    tensors, d2t = check_tensors(spec, d.path)
    width = declared_width(d.config)
    if not draft.block_explicit and width:
        draft = replace(draft, block_size=width)

    def load(loaded: loading.LoadedModel, say) -> Source:
        net = load_net(spec, tensors, d2t, d.path, loaded.model)
        say(
            f"EAGLE-3 drafter: taps the target before layers {list(spec.aux_layer_ids)}, draft vocabulary "
            f"{spec.draft_vocab_size}, from {d.path}"
        )
        return Source.of(draft, loaded, net)

    return Plan(draft, load)

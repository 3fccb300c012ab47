"""The full-model drafter: a smaller causal LM sharing the target's tokenizer, run autoregressively
from its own caches.

Argmax drafts when greedy; otherwise it samples from its filtered distribution q and the verifier
applies the lossless p/q rule. Rejected drafts leave its cache through the same rollback the
target uses (SequenceCache.truncate: trim, window slice or checkpoint replay). Before any weight
loads, `prepare` checks the pair from their files: vocabulary size, every token id, rollback; a
folder another kind's row detects (an MTP head, a DFlash or EAGLE-3 drafter: registry.detect) is
handed to that kind, as the seed page says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx

from ..engine.cache import SequenceCache, text_ids
from ..errors import ModelError
from ..models import loading, preflight
from ..options import DraftConfig
from . import registry
from .base import Drafter, DrafterSource, Plan, Proposal, chain_proposal, draw
from .branching import runner_ups


class FullModelDrafter(Drafter):
    kind = "full-model"

    def __init__(self, model: Any, target_vocab: int | None = None):
        self.model = model
        self.cache = SequenceCache(model)
        self.target_vocab = target_vocab

    def begin(self, context: Sequence[int], target: Any = None) -> None:
        n = self.cache.reuse_prefix(context)
        self.cache.prefill(list(context[n:-1]))

    def commit(self, context: Sequence[int]) -> None:
        pass  # propose() trims to the common prefix with the committed context

    def propose(self, context: Sequence[int], limit: int, decider) -> Proposal:
        return self._draft(context, limit, decider, False)

    def propose_tree(self, context: Sequence[int], limit: int, decider, nodes: int) -> Proposal:
        """The chain, with each step's runner-up beside it (branching.runner_ups)."""
        return self._draft(context, limit, decider, True)

    def _draft(self, context: Sequence[int], limit: int, decider, branch: bool) -> Proposal:
        n = self.cache.reuse_prefix(context)  # drops the rejected drafts (see SequenceCache.truncate)
        feed = list(context[n:])
        self.cache.mark()  # the next propose rolls back to the committed context from here
        x = mx.array(text_ids(feed), dtype=mx.int32)
        picks: list[mx.array] = []
        rows: list[mx.array] = []
        steps: list[mx.array] = []  # each step's logits, for a tree's runner-ups
        start = len(context) - decider.prompt_len
        # The chain stays lazy: each step's input is the previous step's (unevaluated) pick,
        # so k draft steps cost one synchronisation instead of k.
        for i in range(limit):
            logits = self.cache.run(x)[-1:].astype(mx.float32)
            t, q = draw(logits, decider, start + i)
            rows += [q] if q is not None else []
            steps += [logits] if branch else []
            picks.append(t)
            x = t.astype(mx.int32)
        proposal = chain_proposal(picks, rows, self.target_vocab)
        self.cache.appended(feed + proposal.tokens[:-1])
        if branch:
            proposal.tree = runner_ups(proposal.tokens, steps, self.tree_margin)
        return proposal


class Source(DrafterSource):
    """assets: the draft model (an mlx-lm model, or the LoadedModel it came in)."""

    shares_drafter = True

    def __init__(self, draft: DraftConfig, **kw):
        super().__init__(draft, **kw)
        if self.assets is None:
            raise ValueError("the full-model drafter needs its draft model (assets)")
        self.loaded = self.assets if isinstance(self.assets, loading.LoadedModel) else None
        self.draft_model = self.loaded.model if self.loaded is not None else self.assets

    def new_drafter(self) -> FullModelDrafter:
        return FullModelDrafter(self.draft_model, self.vocab_size)

    def warm(self, tokens: Sequence[int]) -> None:
        cache = SequenceCache(self.draft_model)
        cache.feed(tokens)
        mx.eval(mx.argmax(cache.feed(tokens[-1:]), axis=-1))


def check_token_ids(target_tok: Any, draft_tok: Any, draft_path: Any) -> None:
    """Same vocabulary size proves nothing; the id of every drafter token must match the target's."""
    tv = target_tok.get_vocab() if hasattr(target_tok, "get_vocab") else None
    dv = draft_tok.get_vocab() if hasattr(draft_tok, "get_vocab") else None
    if tv is None or dv is None:
        return
    mismatched = [t for t, i in dv.items() if tv.get(t) != i]
    if mismatched:
        example = mismatched[0]
        raise ModelError(
            f"--draft-model {draft_path}: its tokenizer maps {len(mismatched)} token(s) to different ids than the "
            f"target's (e.g. {example!r}: drafter {dv[example]}, target {tv.get(example)}); pick a drafter from "
            f"the target's family"
        )


def prepare(draft: DraftConfig, target: loading.ResolvedModel, model_options: Any) -> Plan:
    resolved = loading.resolve(draft.draft_model, what="--draft-model")
    detected = registry.detected_kind(resolved.config)
    if detected is not None:
        if draft.kind_explicit:
            raise ModelError(
                f"--draft-model {draft.draft_model} is {detected.describe(resolved.config)}, not a standalone "
                f"model; use --draft-kind {detected.name} (or drop --draft-kind: the folder is detected)"
            )
        # as the seed page says: a drafter's checkpoint given as --draft-model means its kind
        width = draft.block_size if draft.block_explicit else detected.default_width
        return detected.prepare(replace(draft, kind=detected.name, block_size=width), target, model_options)
    preflight.check_drafter(target, resolved)
    check_token_ids(loading.load_tokenizer_only(target), loading.load_tokenizer_only(resolved), draft.draft_model)
    loading.check_rollback_config(resolved.config, what="the draft model")

    def load(loaded: loading.LoadedModel, say) -> Source:
        m = model_options
        dm = loading.load(
            resolved,
            dequantize=m.dequantize,
            fast_kernels=m.fast_kernels,
            cpu_weights=m.cpu_weights,
            cache_types=m.cache_types,
            text_only=True,
        )
        say(f"draft model: {resolved.source} ({dm.dtype})")
        return Source.of(draft, loaded, dm)

    return Plan(draft, load)

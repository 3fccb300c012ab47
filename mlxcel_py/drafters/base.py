"""What a drafter is to the engine, the base class every drafter (a user's too) derives from, and
what one engine drafts with (`DrafterSource`).

A drafter proposes tokens and the engine verifies them: the target's own choices decide what is
emitted, so a drafter only changes speed. The engine's side of the contract, per request:
`begin(context, target_cache)` once, `propose(context, limit, decider)` before a round,
`commit(context)` after it, `shadow(limit)` while a gated policy is paused. Built-in drafters
implement those. A user's drafter implements only `draft(context, k)` (up to k token ids) and,
if it follows the context, `observe(accepted)`; the base class turns that into the engine's side,
keeping the ids the vocabulary has and at most k of them, so any proposal is safe to verify.

A `DrafterSource` belongs to one engine: it makes a drafter per request (model drafters share one,
and its caches, across requests unless requests run interleaved), the round policy its kind uses
(`registry`), warmup of its own forward, and what it remembers across requests (a suffix store).
Each drafter module defines a `Source` and `prepare()` (see `registry`).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..engine.policy import make_policy, on_cuda
from ..engine.sampling import Decider
from ..engine.tree import DraftTree
from ..options import DraftConfig
from . import registry


@dataclass
class Proposal:
    tokens: list[int]
    q: mx.array | None = None  # (len(tokens), V) proposal distribution, None for one-hot drafts
    match_len: int | None = None  # lookup drafters: how long the matched context is (confidence)
    # a draft tree (engine.tree.DraftTree) whose first chain is `tokens`, nodes best first
    tree: DraftTree | None = None


class Drafter:
    """Subclass and implement `draft(context, k)` (and, optionally, `observe(accepted)`)."""

    kind = "custom"  # what stats and `timings.draft_kind` call it
    hidden_tap = None  # a models.taps.HiddenTap when it reads the target's hidden states (MTP heads)
    tree_margin = math.inf  # model drafters' trees: branch to tokens this close to the best logit (branching.py)

    def draft(self, context: Sequence[int], k: int) -> Sequence[int]:
        """Up to k token ids to follow `context` (prompt and output so far); [] drafts nothing."""
        raise NotImplementedError(f"{type(self).__name__} implements neither draft() nor propose()")

    def observe(self, accepted: Sequence[int]) -> None:
        """The tokens just committed after the context this drafter saw last (its own accepted
        drafts and the target's tokens alike)."""

    # ---- the engine's side ---------------------------------------------------------------------
    def begin(self, context: Sequence[int], target: Any = None) -> None:
        self._seen = len(context)

    def propose(self, context: Sequence[int], limit: int, decider: Decider) -> Proposal:
        vocab = decider.vocab_size
        tokens: list[int] = []
        for t in itertools.islice(self.draft(list(context), limit) or (), limit):
            try:
                t = operator.index(t)
            except TypeError:
                break  # not an integer: the proposal ends here
            if t < 0 or (vocab is not None and t >= vocab):
                break  # outside the vocabulary: the embedding would read past its rows
            tokens.append(t)
        return Proposal(tokens)

    def propose_tree(self, context: Sequence[int], limit: int, decider: Decider, nodes: int) -> Proposal:
        """`propose`, with alternatives: a `tree` of up to `nodes` nodes at most `limit` deep whose
        first chain is the proposal's tokens (asked only for greedy requests on an engine that
        verifies trees). The base proposes a chain; each built-in kind builds its own tree."""
        return self.propose(context, limit, decider)

    def commit(self, context: Sequence[int]) -> None:
        seen = getattr(self, "_seen", 0)
        self._seen = len(context)
        if len(context) > seen:
            self.observe(list(context[seen:]))

    def shadow(self, limit: int) -> list[int]:
        return []


def stop_at_eos(tokens: list[int], eos_ids: frozenset[int], decider: Decider) -> list[int]:
    """Output ends at EOS, so drafting past one only widens the verify block for nothing."""
    if eos_ids and not decider.ignore_eos:
        for i, t in enumerate(tokens):
            if t in eos_ids:
                return tokens[: i + 1]
    return tokens


def draw(logits: mx.array, decider: Decider, index: int) -> tuple[mx.array, mx.array | None]:
    """A model drafter's pick from one logits row (1, V): argmax when greedy. Sampled, by default
    (--draft-acceptance sampler-match) the token the target's own draw at this position would be
    if its distribution were the drafter's: the same filters, temperature and key, so the same
    Gumbel noise over a row as wide as the target's (Gumbel-max coupling). Where the two
    distributions agree the draft equals the target's draw and stands; verification compares it
    with that draw (q None: sampler-match), so every token is the one plain sampling picks under
    the same seed. With p-q, a sample from the filtered q under a key of its own, returned for the
    lossless p/q rule. Stays lazy."""
    if decider.greedy:
        return mx.argmax(logits, axis=-1), None
    if decider.pq_drafts:
        q = decider.probs(logits)
        return mx.random.categorical(mx.log(q), key=decider.key(index, salt=3)), q
    row = decider.tempered(decider.filtered_logprobs(logits.astype(mx.float32)))[0]
    width = decider.vocab_size or row.shape[0]
    if row.shape[0] != width:  # the target's row width: the noise of token i is then the target's
        row = row[:width] if row.shape[0] > width else mx.pad(row, [(0, width - row.shape[0])], constant_values=-mx.inf)
    return mx.random.categorical(row, key=decider.key(index)).reshape(1), None


def chain_proposal(picks: list[mx.array], rows: list[mx.array], target_vocab: int | None) -> Proposal:
    """Evaluate a lazy draft chain once: its tokens, and q (padded to the target's vocabulary)."""
    tokens = mx.concatenate(picks)
    q = mx.concatenate(rows, axis=0) if rows else None
    if q is not None and target_vocab and q.shape[-1] < target_vocab:
        q = mx.pad(q, [(0, 0), (0, target_vocab - q.shape[-1])])
    mx.eval(tokens, *([q] if q is not None else []))
    return Proposal(tokens.tolist(), q)


class DrafterSource:
    """What one engine drafts with; see the module note. Subclasses: each kind's `Source`."""

    shares_drafter = False  # one drafter (and its caches) across requests, unless `private`

    def __init__(
        self,
        draft: DraftConfig,
        *,
        model: Any,
        eos_ids: Sequence[int] = (),
        vocab_size: int | None = None,
        assets: Any = None,
    ):
        self.config = draft
        self.model = model  # the target mlx-lm model
        self.eos_ids = tuple(eos_ids)
        self.vocab_size = vocab_size
        self.assets = assets  # what the kind loaded: a draft model, an MTP head, a suffix store
        self._shared: Drafter | None = None

    @property
    def kind(self) -> str:
        return self.config.kind

    @property
    def width(self) -> int:
        return registry.width(self.config)

    @property
    def calibrates(self) -> bool:
        return registry.calibrates(self.config)

    def new_drafter(self) -> Drafter:
        raise NotImplementedError

    def make(self, private: bool = False) -> Drafter:
        """The drafter for one request (`private`: requests decode interleaved, each its own)."""
        if private or not self.shares_drafter:
            return self._configured(self.new_drafter())
        if self._shared is None:
            self._shared = self._configured(self.new_drafter())
        return self._shared

    def _configured(self, drafter: Drafter) -> Drafter:
        drafter.tree_margin = self.config.tree_margin
        return drafter

    def make_policy(self, verify_cost: Sequence[float] | None = None):
        d = self.config
        if registry.kind_of(d.kind).sizing == registry.ADAPTIVE:
            return make_policy(
                d.lookup.policy,
                d.lookup.max_draft,
                adaptive=d.lookup.adaptive,
                on_cuda=on_cuda(),
                verify_cost=verify_cost,
            )
        if registry.kind_of(d.kind).gated:
            return make_policy("break-even", self.width, verify_cost=verify_cost)
        return make_policy("fixed", self.width, adaptive=False)

    @classmethod
    def of(cls, draft: DraftConfig, loaded: Any, assets: Any = None) -> DrafterSource:
        """The source for a loaded target (a models.loading.LoadedModel): its model, EOS ids and
        vocabulary."""
        return cls(
            draft,
            model=loaded.model,
            eos_ids=loaded.tokenizer.eos_token_ids,
            vocab_size=loaded.vocab_size,
            assets=assets,
        )

    def retarget(self, draft: DraftConfig, loaded: Any) -> DrafterSource:
        """The same loaded assets for another configuration or target (bench: widths, weight modes)."""
        return type(self)(
            draft, model=loaded.model, eos_ids=self.eos_ids, vocab_size=self.vocab_size, assets=self.assets
        )

    def warm(self, tokens: Sequence[int]) -> None:
        """Trace the drafter's own forward at its width (model drafters), on scratch state."""

    def warm_tapped(self, tokens: Sequence[int], width: int) -> None:
        """`warm` for drafters that read the target's hidden states (MTP, DFlash, EAGLE-3): one
        proposal of `width` tokens from a fresh drafter over a scratch target cache that keeps its tap."""
        from ..engine.cache import SequenceCache
        from ..options import SamplingOptions

        drafter = self.new_drafter()
        cache = SequenceCache(self.model)
        cache.keep_hidden(drafter.hidden_tap, getattr(drafter, "hidden_window", None))
        cache.prefill(tokens[:-1])
        drafter.begin(tokens, cache)
        drafter.propose(tokens, width, Decider(SamplingOptions(), prompt_len=len(tokens)))

    def remember(self, tokens: Sequence[int]) -> None:
        """A finished sequence (prompt + output), for drafters that learn across requests."""

    def save(self) -> str | None:
        """Write what should outlive the process (--suffix-store); returns what it did."""
        return None


class NetworkSource(DrafterSource):
    """A source whose assets are one loaded drafter network that reads the target's hidden
    states (DFlash, EAGLE-3): subclasses name the network's type and the drafter that runs it."""

    shares_drafter = True
    network: type = object
    drafter: type = Drafter

    def __init__(self, draft: DraftConfig, **kw):
        super().__init__(draft, **kw)
        if not isinstance(self.assets, self.network):
            raise ValueError(f"the {draft.kind} drafter needs its loaded {self.network.__name__} (assets)")
        self.net = self.assets

    def new_drafter(self) -> Drafter:
        return self.drafter(self.net, self.model, self.vocab_size)

    def warm(self, tokens: Sequence[int]) -> None:
        self.warm_tapped(tokens, self.width)


@dataclass
class Plan:
    """A drafter checked against the target's files before any weight loads: the configuration it
    runs with (`prepare` may have resolved its kind or width) and how to load it."""

    draft: DraftConfig
    load: Callable[[Any, Callable[[str], None]], DrafterSource]  # (target LoadedModel, say) -> source

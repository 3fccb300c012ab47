"""The composite drafter (`generate --prompt-lookup --draft-model DIR`): prompt lookup where the
context has an n-gram match, the model drafter everywhere else, in one round loop.

Copy-heavy replies (edits, code, reformatting) repeat the context, where a lookup draft is free
and long; prose does not, where only a model can guess. Each round asks the lookup index for a
real match first (its one-token fallback does not count) and only then runs the model drafter,
capped at its own width, or the lookup's short fallback drafts there as prompt lookup alone
would: whichever side gave more tokens a second in its recent rounds (timed between proposals),
the model side also only while its break-even policy finds a width that pays. The model drafter
keeps up with the context whichever side drafted: drafters that read the target's hidden states
(EAGLE-3, DFlash, MTP) feed the positions they have not seen on their next proposal (EAGLE-3 at
most the newest 32), and the target keeps those rows until then. Each side
keeps its own policy (`CompositeDrafter`): lookup rounds are sized and paused as prompt lookup
alone would be, and the model side drafts only while it pays (engine.policy.BreakEvenPolicy),
so a drafter that guesses badly costs a few probe rounds, not every round. Every token is still the target's: a
proposal of either kind is verified the same way, and sampled rounds judge a model draft with
its own q and a lookup draft as one-hot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..engine.policy import BreakEvenPolicy, FixedPolicy, VerifyCost, make_policy, on_cuda
from . import registry
from .base import Drafter, DrafterSource, Proposal
from .prompt_lookup import PromptLookupDrafter, drafter_for


class Rate:
    """Tokens a second of one side's recent rounds (each round's weight fading by DECAY)."""

    DECAY = 0.9
    # rounds before the rate is trusted: one, so each side drafts once and then the faster one
    # goes on (3 cost 6-10% against prompt lookup alone on code replies, where the model side's
    # first tries were mostly lost; prose did not move beyond noise: docs/drafter-training.md)
    KNOWN = 1

    def __init__(self) -> None:
        self.tokens = self.seconds = 0.0
        self.rounds = 0

    @property
    def known(self) -> bool:
        return self.rounds >= self.KNOWN

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.DECAY * self.tokens + tokens
        self.seconds = self.DECAY * self.seconds + seconds
        self.rounds += 1


class CompositeDrafter(Drafter):
    """Each side keeps the policy it runs with alone: prompt lookup's (graded by default) sizes and
    pauses lookup drafts, a break-even policy the model's (engine.policy.BreakEvenPolicy). The
    engine's own policy is fixed at the widest proposal; a round neither side drafts is a plain step. What each proposal earned is read off
    the context at the next round (its longest prefix the target kept)."""

    PROBE_EVERY = 16  # rounds one side wins before the other drafts once more anyway

    def __init__(
        self,
        lookup: PromptLookupDrafter,
        model: Drafter,
        model_width: int,
        lookup_policy: Callable[[], Any],
        prices: VerifyCost | None = None,
    ):
        self.lookup, self.model, self.model_width = lookup, model, model_width
        # what a verify of each width costs: the machine's, so it outlives a sequence's rounds
        # (the warmup's calibration, then this drafter's timings; shared by its Source's drafters)
        self.prices = prices if prices is not None else VerifyCost(model_width)
        self.gate: BreakEvenPolicy | None = None
        self.kind = f"prompt-lookup+{model.kind}"
        self.hidden_tap = getattr(model, "hidden_tap", None)  # the engine keeps the rows it reads
        self.hidden_window = getattr(model, "hidden_window", None)
        self.new_lookup_policy = lookup_policy
        self._start_rounds()
        self.from_lookup = self.from_model = 0  # proposals each side made (tests, profile)

    def _start_rounds(self) -> None:
        """What one sequence's rounds learn starts afresh: each side's policy, the sides' rates."""
        self.lookup_policy: Any = self.new_lookup_policy()
        drafting = self.gate.draft_seconds if self.gate is not None else None  # one model draft step
        self.gate = BreakEvenPolicy(self.model_width, prices=self.prices)
        self.gate.draft_seconds = drafting
        self.rates, self.no_match = {"model": Rate(), "fallback": Rate()}, 0
        self.last: tuple[str, int, list[int]] | None = None  # (side, position, tokens) of the last proposal
        self._t = 0.0  # when the last proposal was asked for
        # when the last proposal was handed out and the rows of the forward that follows it
        self._out: tuple[float, int] | None = None

    @property
    def tree_margin(self) -> float:
        return self.model.tree_margin

    @tree_margin.setter
    def tree_margin(self, value: float) -> None:
        self.model.tree_margin = value

    def begin(self, context: Sequence[int], target: Any = None) -> None:
        self.lookup.begin(context, target)
        self.model.begin(context, target)
        self._start_rounds()

    def commit(self, context: Sequence[int]) -> None:
        self.lookup.commit(context)
        self.model.commit(context)

    def _settle(self, context: Sequence[int]) -> None:
        """Tell the side that drafted last round what it earned; a side that did not, that a round passed."""
        side, at, tokens = self.last if self.last is not None else ("", 0, [])
        self.last = None
        now = time.perf_counter()
        if side in self.rates and now > self._t:  # what the round gave, per second of it
            self.rates[side].add(len(context) - at, now - self._t)
        if self._out is not None and now > self._out[0]:
            # the forward that followed the proposal: a verify of its rows (a chain's len + 1, a
            # tree's nodes + 1), or a plain step. The engine times its own policy, which for a
            # composite is a fixed one; each side's policy gets the timings here (without them,
            # or the warmup's calibration, the break-even gate priced a verify row at a default
            # measured on AVX-512, 0.07 of a step, where the AVX2 build pays 0.3-0.4, and its
            # model side drafted on edits at 100 tokens a second against plain decoding's 140)
            t_out, rows = self._out
            self.gate.timed(rows, now - t_out)
            self.lookup_policy.timed(rows, now - t_out)
        self._t, self._out = now, None
        kept = 0
        while kept < len(tokens) and at + kept < len(context) and context[at + kept] == tokens[kept]:
            kept += 1
        if side in ("lookup", "fallback"):
            self.lookup_policy.drafted(len(tokens), kept)
        else:
            self.lookup_policy.plain()
        if side == "model":
            self.gate.drafted(len(tokens), kept)
        else:
            self.gate.plain()

    def _lookup(self, context: Sequence[int], limit: int, decider, fallback: bool = False) -> Proposal | None:
        budget = min(limit, self.lookup_policy.budget())
        if budget <= 0:
            return None
        p = self.lookup.propose(context, budget, decider, fallback=fallback)
        tokens = p.tokens[: self.lookup_policy.size(len(p.tokens), p.match_len)] if p.tokens else []
        if not tokens:
            return None
        self.from_lookup += 1
        self.last = ("fallback" if fallback and p.match_len == 1 else "lookup", len(context), tokens)
        return Proposal(tokens, match_len=p.match_len)

    def _propose(self, context: Sequence[int], limit: int, decider, nodes: int | None) -> Proposal:
        self._settle(context)
        found = self._lookup(context, limit, decider)
        if found is not None:
            return found
        # no real match: the model side or the lookup's short fallback (what prompt lookup alone
        # drafts here), whichever gave more tokens a second in its recent rounds (the model tried
        # first, then the fallback; the other side drafts every PROBE_EVERY such rounds); the
        # model side also only while its break-even policy finds a width that pays
        model, fallback = self.rates["model"], self.rates["fallback"]
        self.no_match += 1
        prefer_model = not model.known or (fallback.known and model.rate >= fallback.rate)
        use_model = prefer_model != (self.no_match % self.PROBE_EVERY == 0)  # the other side, now and then
        width = min(limit, self.gate.budget()) if use_model else 0
        if width <= 0:
            return self._lookup(context, limit, decider, fallback=True) or Proposal([])
        t0 = time.perf_counter()
        p = (
            self.model.propose(context, width, decider)
            if nodes is None
            else self.model.propose_tree(context, width, decider, nodes)
        )
        self.gate.draft_timed(len(p.tokens), time.perf_counter() - t0)
        if p.tokens:
            self.from_model += 1
            self.last = ("model", len(context), list(p.tokens))
        return p

    def propose(self, context: Sequence[int], limit: int, decider) -> Proposal:
        return self._handed_out(self._propose(context, limit, decider, None))

    def propose_tree(self, context: Sequence[int], limit: int, decider, nodes: int) -> Proposal:
        return self._handed_out(self._propose(context, limit, decider, nodes))

    def _handed_out(self, p: Proposal) -> Proposal:
        self._out = (time.perf_counter(), 1 + (len(p.tree) if p.tree is not None else len(p.tokens)))
        return p


class Source(DrafterSource):
    """Wraps the model drafter's source; `config` is the composite's (lookup_first)."""

    def __init__(self, inner: DrafterSource):
        config = inner.config
        inner.config = replace(config, lookup_first=False)  # the model drafter alone: its own width, warmup
        super().__init__(
            config, model=inner.model, eos_ids=inner.eos_ids, vocab_size=inner.vocab_size, assets=inner.assets
        )
        self.inner = inner
        self.shares_drafter = inner.shares_drafter
        self.prices = VerifyCost(self.width)  # verify widths up to the widest proposal of either side

    @property
    def kind(self) -> str:
        return f"prompt-lookup+{self.inner.kind}"

    def new_drafter(self) -> CompositeDrafter:
        lk = self.config.lookup
        return CompositeDrafter(
            drafter_for(lk, self.eos_ids),
            self.inner.new_drafter(),
            registry.model_width(self.config),
            lambda: make_policy(
                lk.policy, lk.max_draft, adaptive=lk.adaptive, on_cuda=on_cuda(), verify_cost=self.prices.shape
            ),
            self.prices,
        )

    def make_policy(self, verify_cost: Sequence[float] | None = None):
        if verify_cost:  # the warmup's calibration (registry.calibrates): the model side's prices
            self.prices.calibrate(verify_cost)
        return FixedPolicy(self.width)  # each side's own policy runs inside the drafter

    def retarget(self, draft, loaded: Any) -> DrafterSource:
        return Source(self.inner.retarget(draft, loaded)) if draft.lookup_first else self.inner.retarget(draft, loaded)

    def warm(self, tokens: Sequence[int]) -> None:
        self.inner.warm(tokens)

    def remember(self, tokens: Sequence[int]) -> None:
        self.inner.remember(tokens)

    def save(self) -> str | None:
        return self.inner.save()

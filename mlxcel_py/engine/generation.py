"""One request's round loop: prefill, then plain steps and verify rounds until EOS or the budget.

Token ids in, TokenEvents out; no CLI, UI or server imports, and nothing of any drafter kind: a
drafter (`RoundDrafter`, drafters/base.py's contract) and a policy come from the engine's
DrafterSource, or from the caller (the Python API); what one request asks for is a frozen
`DecodeRequest`. Each round has three steps, each a method of `RoundLoop`:
- `_propose`: ask the policy for a budget (capped so no round passes max_tokens), ask the drafter
  for a proposal, and size it (the policy, the grammar's admissible prefix, the tree budget);
- `_verify` / `_plain_step`: one target forward of `[last, *draft]` (a draft tree's nodes where the
  engine verifies trees and the request decodes greedily: see engine/tree.py) judged by
  `verify.judge` / `judge_tree`, or a plain step when nothing is proposed;
- `_emit`: the round's tokens out as TokenEvents, the grammar and the drafter told. EOS inside an accepted block ends output exactly where plain decoding
would; a consumer that stops early (stop strings) simply closes the iterator, and only emitted
tokens are counted as accepted. The cache holds every committed token except the newest, which is
the next round's first input. Under a scheduler (`gate.Gate`, serve -np N) the loop also yields
Ticks and leaves its forwards to the scheduler's batched forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx

from ..cpu import extension as cpu_extension
from ..options import SamplingOptions
from . import context_shift
from .cache import SequenceCache, text_prefix
from .policy import Policy
from .sampling import Decider
from .stats import GenerationStats
from .tree import DraftTree
from .verify import RULE_GREEDY, RULE_PQ, RULE_SAMPLER_MATCH, Verdict, judge, judge_tree

if TYPE_CHECKING:
    from ..drafters.base import Proposal
    from .context_shift import ContextShift
    from .engine import Engine
    from .gate import Gate
    from .grammar import OutputRule


@dataclass(frozen=True)
class TokenEvent:
    token: int
    from_draft: bool


class Tick:
    """What a scheduled RoundLoop yields besides TokenEvents (see `batch`): PAUSE after a prefill
    chunk (its turn is over for this tick), NEED_STEP when its next forward (a plain step, or a
    verify round's block) waits in `step_request` for the scheduler's batched forward, whose rows
    come back in `step_result`."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


PAUSE, NEED_STEP = Tick("PAUSE"), Tick("NEED_STEP")


@dataclass(frozen=True)
class TokenLogprob:
    """The target model's log-probability of an emitted token (log-softmax of its raw logits, as
    OpenAI's `logprobs` reports them), and the `top` most likely tokens at that position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(
    rows: mx.array, tokens: Sequence[int], top: int, tiebreak: mx.array | None = None
) -> list[TokenLogprob]:
    """Each token's log-probability under `rows` and the `top` most likely tokens. `tiebreak`
    (the model's own logits, for a sampler's distribution): tokens of equal probability, the
    sampler's zeros above all, rank by it, as llama-server lists them (not by token id)."""
    lp = rows.astype(mx.float32)
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, mx.array(list(tokens), dtype=mx.int32)[:, None], axis=-1)[:, 0].tolist()
    best: list = [[] for _ in tokens]
    if top and tiebreak is not None:
        import numpy as np

        first, then = np.array(-lp), np.array(-tiebreak.astype(mx.float32))
        order = mx.array(np.stack([np.lexsort((then[r], first[r]))[:top] for r in range(first.shape[0])]))
        vals = mx.take_along_axis(lp, order, axis=-1)
        best = [list(zip(o, v)) for o, v in zip(order.tolist(), vals.tolist())]
    elif top:
        order = mx.argsort(-lp, axis=-1)[:, :top]
        vals = mx.take_along_axis(lp, order, axis=-1)
        best = [list(zip(o, v)) for o, v in zip(order.tolist(), vals.tolist())]
    return [TokenLogprob(t, c, tuple(b)) for t, c, b in zip(tokens, chosen, best)]


class RoundDrafter(Protocol):
    """What the round loop asks of a drafter (drafters/base.py's `Drafter` implements it)."""

    kind: str
    hidden_tap: Any  # a models.taps.HiddenTap when it reads the target's hidden states, else None

    def begin(self, context: Sequence[int], target: Any = None) -> None: ...

    def propose(self, context: Sequence[int], limit: int, decider: Decider) -> Proposal: ...

    def propose_tree(self, context: Sequence[int], limit: int, decider: Decider, nodes: int) -> Proposal: ...

    def commit(self, context: Sequence[int]) -> None: ...

    def shadow(self, limit: int) -> list[int]: ...


@dataclass(frozen=True)
class DecodeRequest:
    """One request, as `Engine.generate` was asked for it (max_tokens already fits the window,
    unless the request shifts its context when the window fills: `shift`)."""

    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingOptions
    min_tokens: int = 0
    ignore_eos: bool = False
    speculative: bool = True
    reuse_cache: bool = False  # chat: continue the engine's own cache across turns
    # False: no stored prefix is taken or kept and the whole prompt is fed (llama-server's
    # cache_prompt: false); the output is the same, only the prefill time differs
    reuse_prefix: bool = True
    remember: bool = True  # add prompt + output to the suffix store at the end
    cancelled: Callable[[], bool] | None = None  # asked between prefill chunks and before every round
    logprobs: int | None = None  # None: none; N >= 0: each emitted token's logprob and the N likeliest
    post_sampling: bool = False  # logprobs after the sampler chain (llama-server's post_sampling_probs)
    # a scheduler drives this request (serve -np N): it then yields Ticks too, drafts only while
    # the gate is open, and leaves its forwards to the batched forward
    gate: Gate | None = None
    drafter: RoundDrafter | None = None  # the caller's (the Python API), else the engine's
    policy: Policy | None = None  # the caller's, else the engine's
    constraint: OutputRule | None = None  # the output follows a grammar: drafts cut to it, rows masked
    # llama-server's --draft-min (speculative.n_min): a draft shorter than this is dropped and the
    # round decodes plainly, as a verify block that short would cost more than it saves
    min_draft: int = 0
    shift: ContextShift | None = None  # llama-server's --context-shift (engine/context_shift.py)


@dataclass
class _Proposed:
    """What a round verifies: the sized draft, its distribution (None: one-hot), its tree."""

    draft: list[int] = field(default_factory=list)
    q: mx.array | None = None
    tree: DraftTree | None = None


@dataclass
class _Decoding:
    """What lasts across one request's rounds."""

    cache: SequenceCache
    decider: Decider
    history: list[int]
    drafter: RoundDrafter | None
    policy: Policy | None
    eos: set[int]
    tree_nodes: int  # draft-tree nodes a round may verify (0: chains)
    t0: float
    emitted: int = 0
    shadow: list[int] = field(default_factory=list)  # a paused gated policy's shadow proposal
    shadow_pos: int = 0  # where in history the shadow proposal starts


class RoundLoop:
    """One request's token stream. Iterate it once; read `stats` and `finish_reason` after."""

    def __init__(self, engine: Engine, request: DecodeRequest):
        self.engine = engine
        self.request = request
        self.constraint = request.constraint
        self.gate = request.gate
        # (cache, block, logits wanted, the block's draft tree or None)
        self.step_request: tuple[SequenceCache, list[int], bool, DraftTree | None] | None = None
        self.step_result: mx.array | None = None
        self.logprobs_out: list[TokenLogprob] = []
        self.prompt = list(request.prompt)
        self.max_tokens = request.max_tokens
        self.speculative = request.speculative and (request.drafter is not None or engine.drafters is not None)
        self.stats = GenerationStats(prompt_tokens=len(self.prompt))
        self.finish_reason: str | None = None
        # prompt tokens (total, taken from a cache, processed so far, ms), one entry as feeding
        # starts and one per chunk fed (llama-server's `prompt_progress`)
        self.progress: list[tuple[int, int, int, float]] = []
        self.tokens: list[int] = []
        self._pooled: SequenceCache | None = None  # taken from engine.prompt_cache, given back at the end
        self._iter = self._run()

    def __iter__(self) -> Iterator[TokenEvent]:
        return self._iter

    def __next__(self) -> TokenEvent:
        return next(self._iter)

    def close(self) -> None:
        self._iter.close()

    # ---------------------------------------------------------------------------------------
    def _run(self) -> Iterator[TokenEvent]:
        channel = self.engine.channel
        try:
            if channel is None:
                yield from self._steps()
            else:
                with channel.busy():  # the other ranks mirror this request's forwards
                    yield from self._steps()
        except GeneratorExit:  # the consumer stopped between tokens: the cache is whole
            self._hand_back()
            raise
        else:
            self._hand_back()
        # any other exception may have left a forward half-applied: that cache is dropped

    def _cancelled(self) -> bool:
        """Asked before every round, not per yielded piece: text held back for a stop string
        yields nothing for a while, and a cancelled request must still stop."""
        if self.request.cancelled is not None and self.request.cancelled():
            self.finish_reason = "cancelled"
            return True
        return False

    def _reusable(self) -> list[int]:
        """What a cache may keep of this prompt: all of it but the last token, or nothing."""
        return self.prompt if self.request.reuse_prefix else []

    def _take_cache(self) -> SequenceCache:
        eng = self.engine
        if eng.prompt_cache is not None and not self.request.reuse_cache:
            # nothing to reuse: a fresh cache, and the pool's entries stay for other requests
            self._pooled = eng.prompt_cache.take(self._reusable())
            return self._pooled
        return eng.sequence_cache(self.request.reuse_cache)

    def _hand_back(self) -> None:
        if self._pooled is not None:
            self.engine.prompt_cache.give(self._pooled)
            self._pooled = None

    def _forward(self, cache: SequenceCache, block: list[int], logits: bool = True, tree: DraftTree | None = None):
        """`block`'s logits rows, fed to `cache` here, or (scheduled) by the scheduler's batched
        forward with the other sequences' blocks: then this yields NEED_STEP and waits for them.
        logits=False (a prompt chunk): the rows may come back as None. `tree`: the block is
        [last, *tree.tokens], a draft tree's rows."""
        if self.gate is None:
            if tree is not None:
                from .batch import batched_forward

                return batched_forward(cache.model, [cache], [block], trees=[tree])[0]
            return cache.feed(block)
        self.step_request = (cache, block, logits, tree)
        yield NEED_STEP
        logits, self.step_request, self.step_result = self.step_result, None, None
        return logits

    # ---- the request: prefill, then rounds ------------------------------------------------
    def _steps(self) -> Iterator[TokenEvent]:
        eng, req, st = self.engine, self.request, self.stats
        if not self.prompt:
            raise ValueError("empty prompt")
        decider = Decider(
            req.sampling,
            eos_ids=eng.eos_ids,
            prompt_len=len(self.prompt),
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            vocab_size=eng.vocab_size,
            pq_drafts=eng.drafters is not None and eng.drafters.config.acceptance == "p-q",
        )
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        cache = self._take_cache()
        drafter = (req.drafter if req.drafter is not None else eng.make_drafter()) if self.speculative else None
        # a drafter that reads the target's hidden states (an MTP head) has the target keep them
        cache.keep_hidden(getattr(drafter, "hidden_tap", None), getattr(drafter, "hidden_window", None))
        if not (yield from self._prefill(cache, t0)):
            return
        history = list(self.prompt)
        policy = None
        if drafter is not None:
            td = time.perf_counter()
            drafter.begin(history, cache)
            policy = req.policy if req.policy is not None else eng.make_policy()
            st.draft_kind = getattr(drafter, "kind", "custom")
            st.policy = policy.name
            st.draft_s += time.perf_counter() - td
        st.acceptance_rule = RULE_GREEDY if decider.greedy else RULE_SAMPLER_MATCH
        d = _Decoding(
            cache=cache,
            decider=decider,
            history=history,
            drafter=drafter,
            policy=policy,
            eos=set() if req.ignore_eos else set(eng.eos_ids),
            # greedy requests without a grammar, on an engine whose forward verifies trees
            tree_nodes=eng.tree_nodes if drafter is not None and decider.greedy and self.constraint is None else 0,
            t0=t0,
        )
        t_decode = time.perf_counter()
        try:
            while d.emitted < self.max_tokens:
                if self._cancelled():
                    return
                if context_shift.due(self, d) and not (yield from context_shift.shift(self, d, PAUSE)):
                    return
                proposed = self._propose(d)
                if proposed.draft:
                    verdict = yield from self._verify(d, proposed)
                    new, n_from_draft, rows = verdict.tokens, verdict.accepted, verdict.rows
                else:
                    new, rows = yield from self._plain_step(d)
                    n_from_draft = 0
                st.rounds += 1
                if (yield from self._emit(d, new, n_from_draft, rows)):
                    return
            self.finish_reason = "length"
        finally:
            st.decode_s = time.perf_counter() - t_decode
            st.peak_memory_bytes = cpu_extension.peak_memory()
            if req.remember:
                eng.remember(self.prompt + self.tokens)

    def _prefill(self, cache: SequenceCache, t0: float) -> Generator[Any, None, bool]:
        """Feed the prompt (all but its last token) after what `cache` already holds of it; False
        if the request was cancelled meanwhile."""
        st = self.stats
        st.cached_tokens = cache.reuse_prefix(self._reusable())
        todo = self.prompt[st.cached_tokens : -1]
        total, cached = len(self.prompt), st.cached_tokens

        def progressed(done: int) -> None:
            report = (total, cached, cached + done, (time.perf_counter() - t0) * 1000)
            if not self.progress or self.progress[-1][2] != report[2]:
                self.progress.append(report)

        progressed(0)
        if self.gate is not None and self.gate.prefill_chunk:
            # each chunk rides in the scheduler's batched forward beside the others' steps (one
            # forward instead of two); its logits rows are not used
            chunk = self.gate.prefill_chunk
            for i in range(0, len(todo), chunk):
                if self._cancelled():
                    return False
                yield from self._forward(cache, list(todo[i : i + chunk]), logits=False)
                cache.eval()
                progressed(min(i + chunk, len(todo)))
        else:
            start = cache.fed
            for fed in cache.prefill_steps(todo, stop=self.request.cancelled):
                if not fed:
                    self.finish_reason = "cancelled"
                    return False
                progressed(cache.fed - start)
                if self.gate is not None:
                    yield PAUSE  # other sequences decode between this prompt's chunks
        progressed(total - cached)  # the last prompt token goes in with the first step
        st.prefill_s = time.perf_counter() - t0
        return True

    def _propose(self, d: _Decoding) -> _Proposed:
        """This round's draft: nothing when there is no drafter, the gate is shut, the budget is
        0 or the policy declines; else the proposal cut to what the policy and grammar take."""
        st, policy, drafter = self.stats, d.policy, d.drafter
        if drafter is None or policy is None or (self.gate is not None and not self.gate.open):
            return _Proposed()
        budget = min(policy.budget(), self.max_tokens - d.emitted - 1, context_shift.room(self, d))
        if budget <= 0:
            if policy.paused:
                st.paused_rounds += 1
                if policy.shadow_len and not d.shadow:
                    d.shadow, d.shadow_pos = drafter.shadow(policy.shadow_len), len(d.history)
            return _Proposed()
        td = time.perf_counter()
        if d.tree_nodes:
            proposal = drafter.propose_tree(d.history, budget, d.decider, d.tree_nodes)
        else:
            proposal = drafter.propose(d.history, budget, d.decider)
        policy.draft_timed(len(proposal.tokens), time.perf_counter() - td)
        draft, q = proposal.tokens, proposal.q
        k = min(policy.size(len(draft), proposal.match_len), text_prefix(draft)) if draft else 0
        if draft and self.constraint is not None:  # the target would never pick a token past this
            k = min(k, self.constraint.admissible(draft[:k]))
        if 0 < k < self.request.min_draft:
            k = 0
        if k < len(draft):  # the policy declines part (or all) of the proposal
            draft, q = draft[:k], (q[:k] if q is not None and k else None)
            if not k:
                st.paused_rounds += 1
        tree = None
        if draft and proposal.tree is not None:
            # the policy sized the first chain; alternatives fill the node budget
            tree = proposal.tree.sized(len(draft), d.tree_nodes, budget)
            tree = None if tree.is_chain else tree
        st.draft_s += time.perf_counter() - td
        return _Proposed(draft, q, tree)

    def _verify(self, d: _Decoding, p: _Proposed) -> Generator[Any, None, Verdict]:
        """One forward of `[last, *draft]` (or of every tree node), judged; the policy and the
        counters learn the round."""
        st, policy, cache, history = self.stats, d.policy, d.cache, d.history
        assert policy is not None
        tv = time.perf_counter()
        if p.tree is not None:  # one forward of every node (engine/tree.py)
            logits = yield from self._forward(cache, [history[-1], *p.tree.tokens], tree=p.tree)
            verdict = judge_tree(cache, history, p.tree, d.decider, logits)
        else:
            cache.mark()  # a checkpoint the judge rolls back to
            logits = yield from self._forward(cache, [history[-1], *p.draft])
            if self.constraint is not None:  # row r under the grammar state after draft[:r]
                logits = self.constraint.mask_rows(logits, p.draft)
            verdict = judge(cache, history, p.draft, d.decider, p.q, logits)
        dt = time.perf_counter() - tv
        st.verify_s += dt
        width = len(p.tree) if p.tree is not None else len(p.draft)
        policy.timed(width + 1, dt)
        if self.gate is not None:  # what the batch's rounds cost and give (gate.Gate.pays)
            self.gate.turn(width + 1, verdict.accepted + 1)
        st.rollback_s += verdict.rollback_s
        if verdict.rule == RULE_PQ:
            st.acceptance_rule = RULE_PQ
        st.drafted_rounds += 1
        st.proposed += width
        st.positions_tested += min(verdict.accepted + 1, max(p.tree.depths) if p.tree else len(p.draft))
        # the policy learns its own chain's acceptance: how far the accepted path followed it
        on_chain = next((i for i, t in enumerate(verdict.tokens[:-1]) if i >= len(p.draft) or t != p.draft[i]), None)
        policy.drafted(len(p.draft), verdict.accepted if on_chain is None else on_chain)
        if p.tree is not None:
            st.tree_rounds += 1
            st.branch_accepts += on_chain is not None
        return verdict

    def _plain_step(self, d: _Decoding) -> Generator[Any, None, tuple[list[int], mx.array]]:
        """One forward of the newest token: the target's next token, and the rows that chose it."""
        tp = time.perf_counter()
        logits = yield from self._forward(d.cache, d.history[-1:])
        if self.constraint is not None:
            logits = self.constraint.mask_rows(logits)
        new = d.decider.decide(logits, d.history, d.history[-1:])
        if self.gate is not None and self.gate.open and d.drafter is not None:
            self.gate.turn(1, 1)
        if d.policy is not None:
            d.policy.timed(1, time.perf_counter() - tp)
            d.policy.plain()
        return new, logits

    def _emit(
        self, d: _Decoding, new: list[int], n_from_draft: int, rows: mx.array
    ) -> Generator[TokenEvent, None, bool]:
        """The round's tokens out, in order, until EOS; then the grammar, a shadow proposal and
        the drafter are told. True when the output is complete."""
        st, history = self.stats, d.history
        # the rows that chose each token: in a verify round the same ones plain decoding computes
        req = self.request
        raw = None
        if req.logprobs is not None and req.post_sampling:  # the sampler's distribution, not the model's
            raw = rows[: len(new)]
            rows = d.decider.sampled_logprobs(raw, history, [history[-1], *new])
        lps = token_logprobs(rows, new, req.logprobs, raw) if req.logprobs is not None else None
        for i, tok in enumerate(new):
            if tok in d.eos and d.emitted >= req.min_tokens:
                self.finish_reason = "stop"
                return True
            history.append(tok)
            self.tokens.append(tok)
            if lps is not None:
                self.logprobs_out.append(lps[i])
            d.emitted += 1
            st.generated_tokens = d.emitted
            if i < n_from_draft:
                st.accepted += 1
            if d.emitted == 1:
                st.ttft_s = time.perf_counter() - d.t0
            yield TokenEvent(tok, i < n_from_draft)
        if self.constraint is not None:
            self.constraint.commit(new)  # all of them were emitted (an EOS returned above)
            if self.constraint.finished:  # the grammar allows nothing more: the output is complete
                self.finish_reason = "stop"
                return True
        if d.shadow:
            # gated policy: a paused lookup resumes once its shadow proposal comes true
            got = history[d.shadow_pos : d.shadow_pos + len(d.shadow)]
            if got != d.shadow[: len(got)]:
                d.shadow = []
            elif len(got) == len(d.shadow):
                d.policy.shadow_confirmed()
                st.shadow_confirmations += 1
                d.shadow = []
        if d.drafter is not None:
            d.drafter.commit(history)
        return False

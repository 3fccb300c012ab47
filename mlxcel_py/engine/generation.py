"""One request's round loop: prefill, then plain steps and verify rounds until EOS or the budget.

Token ids in, TokenEvents out; no CLI, UI or server imports, and nothing of any drafter kind: a
drafter (drafters/base.py's contract) and a policy come from the engine's DrafterSource, or from
the caller (the Python API). Each round: ask the policy for a budget (capped so no round passes
max_tokens), ask the drafter for a proposal, then either a plain step (no proposal) or a verify
round (`verify.judge`; a draft tree's, `verify.judge_tree`, where the engine verifies trees and the
request decodes greedily: see engine/tree.py). EOS inside an accepted block ends output exactly where plain decoding
would; a consumer that stops early (stop strings) simply closes the iterator, and only emitted
tokens are counted as accepted. The cache holds every committed token except the newest, which is
the next round's first input. Under a scheduler (`batch.Gate`, serve -np N) the loop also yields
Ticks and leaves its forwards to the scheduler's batched forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..cpu import weights as cpu_weights
from ..options import SamplingOptions
from .cache import SequenceCache
from .sampling import Decider
from .stats import GenerationStats
from .tree import DraftTree
from .verify import RULE_GREEDY, RULE_PQ, RULE_SAMPLER_MATCH, judge, judge_tree

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True)
class TokenEvent:
    token: int
    from_draft: bool


class Tick:
    """What a scheduled Generation yields besides TokenEvents (see `batch`): PAUSE after a prefill
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


def token_logprobs(rows: mx.array, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    lp = rows.astype(mx.float32)
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, mx.array(list(tokens), dtype=mx.int32)[:, None], axis=-1)[:, 0].tolist()
    best: list = [[] for _ in tokens]
    if top:
        order = mx.argsort(-lp, axis=-1)[:, :top]
        vals = mx.take_along_axis(lp, order, axis=-1)
        best = [list(zip(o, v)) for o, v in zip(order.tolist(), vals.tolist())]
    return [TokenLogprob(t, c, tuple(b)) for t, c, b in zip(tokens, chosen, best)]


class Generation:
    """One request's token stream. Iterate it once; read `stats` and `finish_reason` after."""

    def __init__(
        self,
        engine: Engine,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingOptions,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        speculative: bool = True,
        reuse_cache: bool = False,
        reuse_prefix: bool = True,
        remember: bool = True,
        cancelled: Callable[[], bool] | None = None,
        logprobs: int | None = None,
        gate: Any = None,
        drafter: Any = None,
        policy: Any = None,
        constraint: Any = None,
    ):
        self.engine = engine
        # grammar.Constraint: output follows a grammar; drafts are cut to it, every row masked by it
        self.constraint = constraint
        # batch.Gate when a scheduler drives this generation (serve -np N): it then yields Ticks too,
        # drafts only while the gate is open, and leaves its plain steps to the batched forward
        self.gate = gate
        # (cache, block, logits wanted, the block's draft tree or None)
        self.step_request: tuple[SequenceCache, list[int], bool, DraftTree | None] | None = None
        self.step_result: mx.array | None = None
        # None: none; N >= 0: each emitted token's logprob and the N most likely (self.logprobs_out)
        self.logprobs = logprobs
        self.logprobs_out: list[TokenLogprob] = []
        self.cancelled = cancelled  # asked between prefill chunks and before every round
        self.remember = remember  # add prompt + output to the suffix store at the end
        self.prompt = list(prompt)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        # a drafter and policy of the caller's (the Python API), else the engine's for each request
        self._drafter, self._policy = drafter, policy
        self.speculative = speculative and (drafter is not None or engine.drafters is not None)
        self.reuse_cache = reuse_cache
        # False: no stored prefix is taken or kept and the whole prompt is fed (llama-server's
        # cache_prompt: false); the output is the same, only the prefill time differs
        self.reuse_prefix = reuse_prefix
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

    def _reusable(self) -> list[int]:
        """What a cache may keep of this prompt: all of it but the last token, or nothing."""
        return self.prompt if self.reuse_prefix else []

    def _take_cache(self) -> SequenceCache:
        eng = self.engine
        if eng.prompt_cache is not None and not self.reuse_cache:
            # nothing to reuse: a fresh cache, and the pool's entries stay for other requests
            self._pooled = eng.prompt_cache.take(self._reusable())
            return self._pooled
        return eng.sequence_cache(self.reuse_cache)

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

    def _steps(self) -> Iterator[TokenEvent]:
        eng = self.engine
        st = self.stats
        if not self.prompt:
            raise ValueError("empty prompt")
        decider = Decider(
            self.sampling,
            eos_ids=eng.eos_ids,
            prompt_len=len(self.prompt),
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            vocab_size=eng.vocab_size,
        )
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        cache = self._take_cache()
        drafter = (self._drafter if self._drafter is not None else eng.make_drafter()) if self.speculative else None
        # a drafter that reads the target's hidden states (an MTP head) has the target keep them
        cache.keep_hidden(getattr(drafter, "hidden_tap", None))
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
                if self.cancelled is not None and self.cancelled():
                    self.finish_reason = "cancelled"
                    return
                yield from self._forward(cache, list(todo[i : i + chunk]), logits=False)
                cache.eval()
                progressed(min(i + chunk, len(todo)))
        else:
            start = cache.fed
            for fed in cache.prefill_steps(todo, stop=self.cancelled):
                if not fed:
                    self.finish_reason = "cancelled"
                    return
                progressed(cache.fed - start)
                if self.gate is not None:
                    yield PAUSE  # other sequences decode between this prompt's chunks
        progressed(total - cached)  # the last prompt token goes in with the first step
        st.prefill_s = time.perf_counter() - t0

        history = list(self.prompt)
        policy = None
        if drafter is not None:
            td = time.perf_counter()
            drafter.begin(history, cache)
            policy = self._policy if self._policy is not None else eng.make_policy()
            st.draft_kind = getattr(drafter, "kind", "custom")
            st.policy = policy.name
            st.draft_s += time.perf_counter() - td
        st.acceptance_rule = RULE_GREEDY if decider.greedy else RULE_SAMPLER_MATCH
        eos = set() if self.ignore_eos else set(eng.eos_ids)
        constraint = self.constraint
        # draft-tree nodes a round may verify (0: chains): greedy requests without a grammar, on
        # an engine whose forward verifies trees
        tree_nodes = eng.tree_nodes if drafter is not None and decider.greedy and constraint is None else 0
        shadow: list[int] = []
        shadow_pos = 0
        t_decode = time.perf_counter()
        emitted = 0
        try:
            while emitted < self.max_tokens:
                if self.cancelled is not None and self.cancelled():
                    # checked per round, not per yielded piece: text held back for a stop string
                    # yields nothing for a while, and a cancelled request must still stop
                    self.finish_reason = "cancelled"
                    return
                draft: list[int] = []
                q = None
                tree: DraftTree | None = None
                if drafter is not None and (self.gate is None or self.gate.open):
                    budget = min(policy.budget(), self.max_tokens - emitted - 1)
                    if budget > 0:
                        td = time.perf_counter()
                        if tree_nodes:
                            proposal = drafter.propose_tree(history, budget, decider, tree_nodes)
                        else:
                            proposal = drafter.propose(history, budget, decider)
                        draft, q = proposal.tokens, proposal.q
                        k = policy.size(len(draft), proposal.match_len) if draft else 0
                        if draft and constraint is not None:  # the target would never pick a token past this
                            k = min(k, constraint.admissible(draft[:k]))
                        if k < len(draft):  # the policy declines part (or all) of the proposal
                            draft, q = draft[:k], (q[:k] if q is not None and k else None)
                            if not k:
                                st.paused_rounds += 1
                        if draft and proposal.tree is not None:
                            # the policy sized the first chain; alternatives fill the node budget
                            tree = proposal.tree.sized(len(draft), tree_nodes, budget)
                            tree = None if tree.is_chain else tree
                        st.draft_s += time.perf_counter() - td
                    elif policy.paused:
                        st.paused_rounds += 1
                        if policy.shadow_len and not shadow:
                            shadow, shadow_pos = drafter.shadow(policy.shadow_len), len(history)
                if draft:
                    tv = time.perf_counter()
                    if tree is not None:  # one forward of every node (engine/tree.py)
                        logits = yield from self._forward(cache, [history[-1], *tree.tokens], tree=tree)
                        verdict = judge_tree(cache, history, tree, decider, logits)
                    else:
                        cache.mark()  # verify.verify_round, with the forward possibly the scheduler's
                        logits = yield from self._forward(cache, [history[-1], *draft])
                        if constraint is not None:  # row r under the grammar state after draft[:r]
                            logits = constraint.mask_rows(logits, draft)
                        verdict = judge(cache, history, draft, decider, q, logits)
                    dt = time.perf_counter() - tv
                    st.verify_s += dt
                    width = len(tree) if tree is not None else len(draft)
                    policy.timed(width + 1, dt)
                    st.rollback_s += verdict.rollback_s
                    if verdict.rule == RULE_PQ:
                        st.acceptance_rule = RULE_PQ
                    st.drafted_rounds += 1
                    st.proposed += width
                    st.positions_tested += min(verdict.accepted + 1, max(tree.depths) if tree else len(draft))
                    # the policy learns its own chain's acceptance: how far the accepted path followed it
                    on_chain = next(
                        (i for i, t in enumerate(verdict.tokens[:-1]) if i >= len(draft) or t != draft[i]), None
                    )
                    policy.drafted(len(draft), verdict.accepted if on_chain is None else on_chain)
                    if tree is not None:
                        st.tree_rounds += 1
                        st.branch_accepts += on_chain is not None
                    new, n_from_draft = verdict.tokens, verdict.accepted
                    rows = verdict.rows
                else:
                    tp = time.perf_counter()
                    logits = yield from self._forward(cache, history[-1:])
                    if constraint is not None:
                        logits = constraint.mask_rows(logits)
                    new, n_from_draft = decider.decide(logits, history, history[-1:]), 0
                    rows = logits
                    if policy is not None:
                        policy.timed(1, time.perf_counter() - tp)
                        policy.plain()
                st.rounds += 1
                # the rows that chose each token: in a verify round the same ones plain decoding computes
                lps = token_logprobs(rows, new, self.logprobs) if self.logprobs is not None else None
                for i, tok in enumerate(new):
                    if tok in eos and emitted >= self.min_tokens:
                        self.finish_reason = "stop"
                        return
                    history.append(tok)
                    self.tokens.append(tok)
                    if lps is not None:
                        self.logprobs_out.append(lps[i])
                    emitted += 1
                    st.generated_tokens = emitted
                    if i < n_from_draft:
                        st.accepted += 1
                    if emitted == 1:
                        st.ttft_s = time.perf_counter() - t0
                    yield TokenEvent(tok, i < n_from_draft)
                if constraint is not None:
                    constraint.commit(new)  # all of them were emitted (an EOS returned above)
                    if constraint.finished:  # the grammar allows nothing more: the output is complete
                        self.finish_reason = "stop"
                        return
                if shadow:
                    # gated policy: a paused lookup resumes once its shadow proposal comes true
                    got = history[shadow_pos : shadow_pos + len(shadow)]
                    if got != shadow[: len(got)]:
                        shadow = []
                    elif len(got) == len(shadow):
                        policy.shadow_confirmed()
                        st.shadow_confirmations += 1
                        shadow = []
                if drafter is not None:
                    drafter.commit(history)
            self.finish_reason = "length"
        finally:
            st.decode_s = time.perf_counter() - t_decode
            st.peak_memory_bytes = cpu_weights.peak_memory()
            if self.remember:
                eng.remember(self.prompt + self.tokens)

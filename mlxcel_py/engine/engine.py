"""The engine: one loaded target model, what it drafts with, and warmup.

`Engine.generate()` returns a RoundLoop (an iterator of TokenEvent with `.stats` and
`.finish_reason`, see generation.py). What the engine drafts with is a `DrafterSource` built by
the drafter registry (drafters/registry.py): the engine asks it for a drafter and a policy per
request and never looks at the drafter's kind. Warmup runs one forward at every verify width the
source can ask for, so no request pays for tracing a new shape.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..options import DraftConfig, SamplingOptions
from .cache import SequenceCache
from .generation import DecodeRequest, RoundDrafter, RoundLoop
from .policy import Policy
from .sampling import Decider

UNLIMITED = 2**62  # a shifting request's budget when it asks for no limit: it ends at EOS

if TYPE_CHECKING:
    from .context_shift import ContextShift
    from .gate import Gate
    from .grammar import OutputRule


class Engine:
    """A loaded target (and optional draft) model plus the speculative configuration."""

    def __init__(
        self,
        model: Any,
        *,
        eos_ids: Sequence[int],
        vocab_size: int | None = None,
        context_length: int = 4096,
        drafters: Any = None,
        channel: Any = None,
    ):
        self.model = model
        # mirror.Leader on rank 0 of a distributed run: forwards are announced to the other ranks
        self.channel = channel
        self.eos_ids = tuple(sorted(set(eos_ids)))
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.drafters = drafters  # drafters.base.DrafterSource, or None: plain decoding
        self.verify_cost: list[float] | None = None
        self.prompt_cache = None  # prompt_cache.PromptCache: finished requests' caches (serve --cache-ram)
        # True when several generations run interleaved (serve -np N): model drafters are then made
        # per generation, since a drafter's own cache follows one sequence
        self.private_drafters = False
        self._cache: SequenceCache | None = None
        self._released_draft: DraftConfig | None = None  # the drafter configuration while released

    @property
    def tree_nodes(self) -> int:
        """Draft-tree nodes a round may verify (engine/tree.py): the drafter configuration's
        budget where this model's forward verifies trees, else 0 (chains)."""
        budget = self.draft.tree_budget
        return budget if budget and self.why_no_trees() is None else 0

    def why_no_trees(self) -> str | None:
        """Why this engine verifies chains only (None: it can verify trees)."""
        return self._no_trees

    @functools.cached_property
    def _no_trees(self) -> str | None:
        from .batch import why_no_trees

        return "a distributed run verifies chains" if self.channel is not None else why_no_trees(self.model)

    @property
    def draft(self) -> DraftConfig:
        """The drafter configuration this engine runs (kind None: plain decoding)."""
        if self.drafters is not None:
            return self.drafters.config
        return self._released_draft or DraftConfig()

    # -- release and reload (serve --sleep-idle-seconds) ---------------------------------------
    @property
    def released(self) -> bool:
        return self.model is None

    def release(self) -> None:
        """Let go of the weights, the drafters and every cache they filled. What a server
        reports about the model (window, drafter configuration, end-of-sequence ids, measured
        verify costs) stays, so /props answers the same; `adopt` brings weights back."""
        self._released_draft = self.draft
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        self.model = self.drafters = self._cache = None

    def adopt(self, fresh: Engine) -> None:
        """Take a freshly loaded engine's weights and drafters: the same model and drafter
        configuration loaded again, after `release`."""
        self.model, self.drafters, self._released_draft = fresh.model, fresh.drafters, None

    # -- per-request pieces --------------------------------------------------------------------
    def sequence_cache(self, reuse: bool) -> SequenceCache:
        if not reuse or self._cache is None:
            self._cache = SequenceCache(self.model, self.channel)
        return self._cache

    def keep_prompts(self, budget_bytes: int | None) -> None:
        """Keep finished requests' caches for later prompts sharing a prefix (`budget_bytes`
        None: no limit). Requests with reuse_cache=True (chat) keep using the engine's own cache."""
        from .prompt_cache import PromptCache

        self.prompt_cache = PromptCache(lambda: SequenceCache(self.model, self.channel), budget_bytes)

    def make_drafter(self):
        if self.drafters is None:
            raise RuntimeError("this engine has no drafter")
        return self.drafters.make(private=self.private_drafters)

    def make_policy(self):
        if self.drafters is None:
            raise RuntimeError("this engine has no drafter")
        return self.drafters.make_policy(self.verify_cost)

    def resolve_max_tokens(self, max_tokens: int, prompt_len: int, shifting: bool = False) -> int:
        """The request's budget within the window (-1: until the window is full); a request that
        shifts its context is not capped by the window (-1: until EOS)."""
        if shifting:
            return UNLIMITED if max_tokens < 0 else max_tokens
        room = max(self.context_length - prompt_len, 0)
        return room if max_tokens < 0 else min(max_tokens, room)

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingOptions | None = None,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        speculative: bool = True,
        reuse_cache: bool = False,
        reuse_prefix: bool = True,
        remember: bool = True,
        cancelled: Callable[[], bool] | None = None,
        logprobs: int | None = None,
        gate: Gate | None = None,
        drafter: RoundDrafter | None = None,
        policy: Policy | None = None,
        constraint: OutputRule | None = None,
        min_draft: int | None = None,
        context_shift: ContextShift | None = None,
        post_sampling: bool = False,
    ) -> RoundLoop:
        """A request's round loop (`drafter`, `policy`: the caller's instead of the engine's;
        `constraint`: a grammar the output follows; `min_draft`: the request's own --draft-min;
        `context_shift`: go on past a full window, engine/context_shift.py);
        generation.DecodeRequest says each field."""
        if min_draft is None:
            min_draft = self.drafters.config.min_draft if self.drafters is not None else 0
        request = DecodeRequest(
            prompt=tuple(prompt),
            max_tokens=self.resolve_max_tokens(max_tokens, len(prompt), context_shift is not None),
            sampling=sampling or SamplingOptions(),
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            speculative=speculative,
            reuse_cache=reuse_cache,
            reuse_prefix=reuse_prefix,
            remember=remember,
            cancelled=cancelled,
            logprobs=logprobs,
            gate=gate,
            drafter=drafter,
            policy=policy,
            constraint=constraint,
            min_draft=min_draft,
            shift=context_shift,
            post_sampling=post_sampling,
        )
        return RoundLoop(self, request)

    def remember(self, tokens: Sequence[int]) -> None:
        """Give a finished sequence to the drafter source (a suffix store keeps it)."""
        if self.drafters is not None:
            self.drafters.remember(tokens)

    # -- warmup and calibration ----------------------------------------------------------------
    def warmup(
        self,
        prompt: Sequence[int] | None = None,
        *,
        sampling: SamplingOptions | None = None,
        calibrate: bool = False,
        width: int | None = None,
    ) -> float:
        """One forward at every verify width 1..max_draft+1 (and the sampler), then discard.

        With calibrate=True the widths are timed a second time and `verify_cost[w]` (relative
        to one plain step) feeds the cost-aware policy.
        """
        if self.channel is not None:
            with self.channel.busy():
                return self._warmup(prompt, sampling, calibrate, width)
        return self._warmup(prompt, sampling, calibrate, width)

    def _warmup(
        self, prompt: Sequence[int] | None, sampling: SamplingOptions | None, calibrate: bool, width: int | None
    ) -> float:
        start = time.perf_counter()
        if width is None:  # the widest proposal the engine's drafter can make
            width = self.drafters.width if self.drafters is not None else 0
        widths = list(range(1, width + 2 + self.tree_nodes))  # a tree's branches widen its block
        tokens = list(prompt[:32]) if prompt else [0, 1, 2, 3]
        cache = SequenceCache(self.model, self.channel)
        cache.prefill(tokens)
        decider = Decider(
            sampling or SamplingOptions(), eos_ids=self.eos_ids, prompt_len=len(tokens), vocab_size=self.vocab_size
        )
        times = {}
        for rep in range(2 if calibrate else 1):
            for w in widths:
                t = time.perf_counter()
                for _ in range(3 if rep else 1):
                    # rolled back through the same checkpoint a verify round uses, so caches
                    # that a trim cannot undo (windows, recurrent state) warm up too
                    cache.mark()
                    logits = cache.feed([tokens[-1]] * w)
                    decider.decide(logits, tokens, [tokens[-1]] * w)
                    cache.eval()
                    cache.truncate(len(cache.tokens) - w)
                    cache.release()
                times[w] = (time.perf_counter() - t) / (3 if rep else 1)
        if self.tree_nodes:  # a draft tree's forward (the ragged layout), its path kept as a round keeps it
            from .batch import batched_forward
            from .tree import DraftTree

            tree = DraftTree((tokens[-1], tokens[-1]), (-1, -1))
            logits = batched_forward(self.model, [cache], [[tokens[-1], *tree.tokens]], trees=[tree])[0]
            mx.eval(logits)
            cache.keep_rows(len(cache.tokens) - len(tree), [len(cache.tokens) - 1])
            cache.truncate(len(cache.tokens) - 2)
        if self.drafters is not None:
            self.drafters.warm(tokens)  # the drafter's own forward (model drafters)
        if calibrate:
            base = times[1]
            self.verify_cost = [0.0] + [times[w] / base for w in widths]
        mx.clear_cache()
        return time.perf_counter() - start

"""Draft policies: how many tokens to propose each round, and when to stop proposing.

Pure Python. The engine asks `budget()` before a round (0 = decode plainly this round), then
`size(proposed, match_len)` once the drafter has proposed (how many of those tokens to verify),
reports every drafted round with `drafted(proposed, accepted)`, every plain round with `plain()`,
the time of every target forward with `timed(width, seconds)` and of every proposal with
`draft_timed(tokens, seconds)`.
- graded (mlxcel, Apple-tuned): full block first, budget from an acceptance EMA, pause 4 rounds
  after 3 straight misses, doubling to 32, reset once a round lands.
- gated (mlxcel, CUDA-tuned): narrow blocks on probation, full blocks when the EMA is high, a miss
  pauses; a paused policy resumes only after a 2-token shadow proposal comes true unverified.
- cost (ours): a break-even governor. It sizes each proposal after seeing it: acceptance is
  modelled per position (geometric) separately for each length of the matched context (a
  5-token match is far likelier to continue than a 2-token one), learned online from priors;
  verify cost per width starts from the warmup calibration and follows the forwards actually
  timed in this run (attention grows with context). It verifies the prefix length that maximizes
  expected tokens per unit of time, or nothing when no length beats a plain step.
- break-even (ours, model drafters that may not pay: one trained here, a composite's model
  side): the width with the most expected tokens per unit of time, from acceptance learned
  online and the verify forwards and draft steps timed in the run; pauses that double while no
  width pays, each ended by one probe round.
- fixed (`--prompt-lookup-no-adaptive`): always the maximum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

SHADOW_CONFIRM = 2


class Policy(Protocol):
    name: str
    shadow_len: int  # >0: while paused, the engine checks shadow proposals of this length

    def budget(self) -> int: ...

    def drafted(self, proposed: int, accepted: int) -> None: ...

    def plain(self) -> None: ...

    def size(self, proposed: int, match_len: int | None) -> int: ...

    def timed(self, width: int, seconds: float) -> None: ...

    def draft_timed(self, steps: int, seconds: float) -> None: ...

    def shadow_confirmed(self) -> None: ...

    @property
    def paused(self) -> bool: ...


class _TakesWholeProposals:
    """For mlxcel's policies: the budget alone sizes a round, and timings are not used."""

    def size(self, proposed: int, match_len: int | None) -> int:
        return proposed

    def timed(self, width: int, seconds: float) -> None:
        pass

    def draft_timed(self, steps: int, seconds: float) -> None:
        pass


class FixedPolicy(_TakesWholeProposals):
    name = "fixed"
    shadow_len = 0
    paused = False

    def __init__(self, max_draft: int):
        self.max_draft = max_draft

    def budget(self) -> int:
        return self.max_draft

    def drafted(self, proposed: int, accepted: int) -> None:
        pass

    def plain(self) -> None:
        pass

    def shadow_confirmed(self) -> None:
        pass


class Backoff:
    """Pauses that double while they keep being called for: `first`, 2x ... up to `most` rounds."""

    def __init__(self, first: int, most: int):
        self.first, self.most = first, most
        self.length, self.left, self.count = first, 0, 0

    def pause(self) -> None:
        self.left, self.count = self.length, self.count + 1
        self.length = min(2 * self.length, self.most)

    def reset(self) -> None:
        self.length = self.first

    def tick(self) -> None:
        if self.left > 0:
            self.left -= 1


class GradedPolicy(_TakesWholeProposals):
    name = "graded"
    shadow_len = 0
    MISSES_TO_PAUSE = 3
    FIRST_PAUSE = 4
    MAX_PAUSE = 32

    def __init__(self, max_draft: int):
        self.max_draft = max_draft
        self.ema = float(max_draft)
        self.misses = 0
        self.backoff = Backoff(self.FIRST_PAUSE, self.MAX_PAUSE)

    @property
    def paused(self) -> bool:
        return self.backoff.left > 0

    def budget(self) -> int:
        if self.paused:
            return 0
        return max(1, min(self.max_draft, int(round(2 * self.ema)) + 2))

    def drafted(self, proposed: int, accepted: int) -> None:
        self.ema = 0.5 * self.ema + 0.5 * accepted
        if accepted > 0:
            self.misses = 0
            self.backoff.reset()
            return
        self.misses += 1
        if self.misses >= self.MISSES_TO_PAUSE:
            self.backoff.pause()
            self.misses = 0

    def plain(self) -> None:
        self.backoff.tick()

    def shadow_confirmed(self) -> None:
        pass


class GatedPolicy(_TakesWholeProposals):
    name = "gated"
    shadow_len = SHADOW_CONFIRM
    NARROW = 2
    FULL_AT = 1.5
    MISSES_TO_PAUSE = 3

    def __init__(self, max_draft: int):
        self.max_draft = max_draft
        self._resume()
        self.shadow_confirmations = 0

    def _resume(self) -> None:
        self.ema = 1.0
        self.probation = True
        self.misses = 0
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def budget(self) -> int:
        if self._paused:
            return 0
        if self.probation or self.ema < self.FULL_AT:
            return min(self.NARROW, self.max_draft)
        return self.max_draft

    def drafted(self, proposed: int, accepted: int) -> None:
        self.ema = 0.5 * self.ema + 0.5 * accepted
        if self.probation:
            if accepted >= proposed:
                self.probation = False
            elif accepted == 0:
                self._paused = True
            return
        if accepted == 0:
            self.misses += 1
            if self.misses >= self.MISSES_TO_PAUSE:
                self._paused = True
        else:
            self.misses = 0

    def plain(self) -> None:
        pass

    def shadow_confirmed(self) -> None:
        self.shadow_confirmations += 1
        self._resume()


class Acceptance:
    """A draft's acceptance, geometric: a round of n drafts with a accepted counts a hits and a
    miss unless all were taken; from a prior worth `weight` rounds, the last WINDOW kept."""

    WINDOW = 32.0  # observations kept: older rounds fade so a change of text is noticed

    def __init__(self, prior: float, weight: float):
        self.hits, self.misses = prior * weight, (1 - prior) * weight

    @property
    def alpha(self) -> float:
        return self.hits / (self.hits + self.misses)

    def add(self, proposed: int, accepted: int) -> None:
        self.hits += accepted
        self.misses += 1 if accepted < proposed else 0
        total = self.hits + self.misses
        if total > self.WINDOW:
            self.hits *= self.WINDOW / total
            self.misses *= self.WINDOW / total


class VerifyCost:
    """A verify forward's cost by width, relative to a plain step (width 1): measured when both
    were timed in this run (an average weighing the newest timing TIME_EMA), else the warmup's
    calibration or the default shape (_verify_shape)."""

    TIME_EMA = 0.3  # weight of the newest timing of a width

    def __init__(self, max_draft: int, verify_cost: Sequence[float] | None = None):
        self.max_draft = max_draft
        self.shape = _verify_shape(max_draft, verify_cost)
        self.seconds: dict[int, float] = {}  # verify forward of w rows (1: a plain step)

    def calibrate(self, verify_cost: Sequence[float]) -> None:
        """Take a warmup's calibration as the shape (timings in this run still come first)."""
        self.shape = _verify_shape(self.max_draft, verify_cost)

    def __call__(self, width: int) -> float:
        one = self.seconds.get(1)
        if one and width in self.seconds:
            return self.seconds[width] / one
        return self.shape[min(width, len(self.shape) - 1)]

    def timed(self, width: int, seconds: float) -> None:
        old = self.seconds.get(width)
        self.seconds[width] = seconds if old is None else (1 - self.TIME_EMA) * old + self.TIME_EMA * seconds


def _best_width(alpha: float, cost: VerifyCost, most: int, draft_cost: float = 0.0) -> int:
    """The number of drafts k (0..most) with the most expected tokens per plain step's time:
    (1 + a + ... + a^k) / (cost(k + 1) + k * draft_cost); 0 (a plain step, one token per unit)
    unless some k beats it."""
    best_k, best_rate, expected = 0, 1.0, 1.0
    for k in range(1, most + 1):
        expected += alpha**k
        rate = expected / (cost(k + 1) + k * draft_cost)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


class BreakEvenPolicy(_TakesWholeProposals):
    """A model drafter whose worth depends on the text (one trained here, a composite's model
    side). Each round it drafts the width k that maximizes expected tokens per unit of time,
    (1 + a + ... + a^k) / (verify(k + 1) + k * draft), where a is a draft's acceptance learned
    online (geometric, windowed, from an even prior) and verify(w) and draft are the verify
    forwards and draft steps timed in this run, relative to a plain step (until timed: the
    warmup's calibration or 1 + 0.07 per extra row, and DRAFT_COST). When no width beats a plain
    step it pauses for 4, 8, ... 64 rounds of plain steps, then probes one round at full width
    (acceptance is only learned by drafting). Measured on this 2-core CPU with SmolLM2-135M: a
    fused EAGLE-3 draft step ~0.06 of a target step, a 2-row verify ~1.05, a 4-row one ~1.3."""

    name = "break-even"
    shadow_len = 0
    PRIOR_ALPHA = 0.5
    PRIOR_WEIGHT = 2.0  # light: a drafter that misses stops within a few rounds
    DRAFT_COST = 0.1  # a draft step relative to a plain step, until both are timed

    def __init__(self, max_draft: int, verify_cost: Sequence[float] | None = None, *, prices: VerifyCost | None = None):
        self.max_draft = max_draft
        self.acceptance = Acceptance(self.PRIOR_ALPHA, self.PRIOR_WEIGHT)
        # `prices`: verify costs kept beyond one sequence (a composite's, drafters/composite.py)
        self.cost = prices if prices is not None else VerifyCost(max_draft, verify_cost)
        self.draft_seconds: float | None = None  # one draft step
        self.backoff = Backoff(4, 64)
        self._probe = False  # a pause just ended: draft once whatever the estimate says

    @property
    def paused(self) -> bool:
        return self.backoff.left > 0

    @property
    def alpha(self) -> float:
        return self.acceptance.alpha

    def draft_cost(self) -> float:
        one = self.cost.seconds.get(1)
        return self.draft_seconds / one if one and self.draft_seconds is not None else self.DRAFT_COST

    def budget(self) -> int:
        if self.paused:
            return 0
        if self._probe:
            self._probe = False
            return self.max_draft
        k = _best_width(self.alpha, self.cost, self.max_draft, self.draft_cost())
        if k == 0:
            self.backoff.pause()
            self._probe = True
        else:
            self.backoff.reset()
        return k

    def drafted(self, proposed: int, accepted: int) -> None:
        self.acceptance.add(proposed, accepted)

    def draft_timed(self, steps: int, seconds: float) -> None:
        if steps > 0:
            per, old, ema = seconds / steps, self.draft_seconds, VerifyCost.TIME_EMA
            self.draft_seconds = per if old is None else (1 - ema) * old + ema * per

    def timed(self, width: int, seconds: float) -> None:
        self.cost.timed(width, seconds)

    def plain(self) -> None:
        self.backoff.tick()

    def shadow_confirmed(self) -> None:
        pass


def _verify_shape(max_draft: int, verify_cost: Sequence[float] | None) -> list[float]:
    """Verify cost by width relative to a plain step: the warmup's calibration, extended, or a
    default measured on a 2-core x86 CPU (~1.0 + 0.07 per extra row); never cheaper when wider."""
    shape = list(verify_cost) if verify_cost else [0.0] + [1.0 + 0.07 * (w - 1) for w in range(1, max_draft + 2)]
    while len(shape) < max_draft + 2:  # extrapolate a short calibration linearly
        shape.append(shape[-1] + (shape[-1] - shape[-2] if len(shape) > 2 else 0.07))
    for w in range(2, len(shape)):  # a wider block never costs less (timing noise aside)
        shape[w] = max(shape[w], shape[w - 1])
    return shape


class CostPolicy:
    """Break-even governor. `verify_cost[w]` = time of a verify forward of w rows / one plain step."""

    name = "cost"
    shadow_len = 0
    # prior per-position acceptance for matched-context lengths 1, 2, 3, 4, 5+ (measured on the
    # edit/code/reformat workloads with SmolLM2-135M), each worth PRIOR_WEIGHT observations
    PRIOR_ALPHA = (0.4, 0.6, 0.8, 0.88, 0.93)
    PRIOR_WEIGHT = 4.0
    PROBE_EVERY = 8  # after this many declined proposals of one bucket, verify 2 tokens anyway

    def __init__(self, max_draft: int, verify_cost: Sequence[float] | None = None):
        self.max_draft = max_draft
        self.cost = VerifyCost(max_draft, verify_cost)
        # per bucket; each keeps its last Acceptance.WINDOW observations, so a change of regime is noticed
        self.acceptance = [Acceptance(a, self.PRIOR_WEIGHT) for a in self.PRIOR_ALPHA]
        self.declined = [0] * len(self.PRIOR_ALPHA)
        self._bucket = 0
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def _bucket_of(self, match_len: int | None) -> int:
        return min(max(match_len or 1, 1), len(self.PRIOR_ALPHA)) - 1

    def budget(self) -> int:
        return self.max_draft

    def size(self, proposed: int, match_len: int | None) -> int:
        self._bucket = self._bucket_of(match_len)
        a = self.acceptance[self._bucket].alpha
        best_k = _best_width(a, self.cost, min(proposed, self.max_draft))
        self._paused = best_k == 0
        if best_k == 0:
            b = self._bucket
            self.declined[b] += 1
            if self.declined[b] >= self.PROBE_EVERY:  # without a probe a bucket never recovers
                self.declined[b] = 0
                self._paused = False
                return min(2, proposed, self.max_draft)
        return best_k

    def drafted(self, proposed: int, accepted: int) -> None:
        self.acceptance[self._bucket].add(proposed, accepted)

    def timed(self, width: int, seconds: float) -> None:
        self.cost.timed(width, seconds)

    def plain(self) -> None:
        pass

    def draft_timed(self, steps: int, seconds: float) -> None:
        pass  # prompt lookup's drafts cost next to nothing

    def shadow_confirmed(self) -> None:
        pass


def on_cuda() -> bool:
    """Whether MLX runs on a CUDA GPU (the auto policy is gated there, graded elsewhere)."""
    import mlx.core as mx

    try:
        return mx.default_device() == mx.gpu and mx.cuda.is_available()
    except AttributeError:
        return False


def make_policy(
    name: str,
    max_draft: int,
    *,
    adaptive: bool = True,
    on_cuda: bool = False,
    verify_cost: Sequence[float] | None = None,
) -> Policy:
    if not adaptive:
        return FixedPolicy(max_draft)
    if name == "auto":
        name = "gated" if on_cuda else "graded"
    if name == "graded":
        return GradedPolicy(max_draft)
    if name == "gated":
        return GatedPolicy(max_draft)
    if name == "cost":
        return CostPolicy(max_draft, verify_cost)
    if name == "break-even":
        return BreakEvenPolicy(max_draft, verify_cost)
    raise ValueError(f"unknown draft policy {name!r}")

"""Draft policies: how many tokens to propose each round, and when to stop proposing.

Pure Python. The engine asks `budget()` before a round (0 = decode plainly this round), reports
every drafted round with `drafted(proposed, accepted)` and every plain round with `plain()`.
- graded (mlxcel, Apple-tuned): full block first, budget from an acceptance EMA, pause 4 rounds
  after 3 straight misses, doubling to 32, reset once a round lands.
- gated (mlxcel, CUDA-tuned): narrow blocks on probation, full blocks when the EMA is high, a miss
  pauses; a paused policy resumes only after a 2-token shadow proposal comes true unverified.
- cost (ours): a break-even governor from verify costs measured on this device at warmup; it
  proposes the width that maximizes expected tokens per unit of time, and 0 when nothing beats
  a plain step. Acceptance is modelled per position (geometric), estimated with a prior.
- fixed (`--prompt-lookup-no-adaptive`): always the maximum.
"""

from __future__ import annotations

from typing import Protocol, Sequence

SHADOW_CONFIRM = 2


class DraftPolicy(Protocol):
    name: str
    shadow_len: int  # >0: while paused, the engine checks shadow proposals of this length

    def budget(self) -> int: ...

    def drafted(self, proposed: int, accepted: int) -> None: ...

    def plain(self) -> None: ...

    def shadow_confirmed(self) -> None: ...

    @property
    def paused(self) -> bool: ...


class FixedPolicy:
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


class GradedPolicy:
    name = "graded"
    shadow_len = 0
    MISSES_TO_PAUSE = 3
    FIRST_PAUSE = 4
    MAX_PAUSE = 32

    def __init__(self, max_draft: int):
        self.max_draft = max_draft
        self.ema = float(max_draft)
        self.misses = 0
        self.pause_len = self.FIRST_PAUSE
        self.pause_left = 0

    @property
    def paused(self) -> bool:
        return self.pause_left > 0

    def budget(self) -> int:
        if self.pause_left > 0:
            return 0
        return max(1, min(self.max_draft, int(round(2 * self.ema)) + 2))

    def drafted(self, proposed: int, accepted: int) -> None:
        self.ema = 0.5 * self.ema + 0.5 * accepted
        if accepted > 0:
            self.misses = 0
            self.pause_len = self.FIRST_PAUSE
            return
        self.misses += 1
        if self.misses >= self.MISSES_TO_PAUSE:
            self.pause_left = self.pause_len
            self.pause_len = min(self.pause_len * 2, self.MAX_PAUSE)
            self.misses = 0

    def plain(self) -> None:
        if self.pause_left > 0:
            self.pause_left -= 1

    def shadow_confirmed(self) -> None:
        pass


class GatedPolicy:
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


class CostPolicy:
    """Break-even governor. `verify_cost[w]` = time of a verify forward of w rows / one plain step."""

    name = "cost"
    shadow_len = 0
    PRIOR_HITS = 1.0  # prior: per-position acceptance 0.5 with weight 2
    PRIOR_MISSES = 1.0
    DECAY = 0.9  # forget old rounds so a reply that starts copying is noticed
    PROBE_EVERY = 8  # while below break-even, still probe narrowly this often
    MARGIN = 1.02  # drafting must beat a plain step by 2% to be worth its variance

    def __init__(self, max_draft: int, verify_cost: Sequence[float] | None = None):
        self.max_draft = max_draft
        # default shape measured on a 2-core x86 CPU with OpenBLAS: ~1.0 + 0.07 per extra row
        self.verify_cost = list(verify_cost) if verify_cost else [0.0] + [1.0 + 0.07 * (w - 1) for w in range(1, max_draft + 2)]
        self.hits = self.PRIOR_HITS
        self.misses = self.PRIOR_MISSES
        self.since_probe = 0
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def alpha(self) -> float:
        return self.hits / (self.hits + self.misses)

    def _best_width(self) -> tuple[int, float]:
        a = self.alpha
        best_k, best_rate = 0, 1.0  # k = 0: a plain step, one token per unit cost
        expected = 1.0
        for k in range(1, self.max_draft + 1):
            expected += a**k
            rate = expected / self.verify_cost[min(k + 1, len(self.verify_cost) - 1)]
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def budget(self) -> int:
        k, rate = self._best_width()
        if k > 0 and rate >= self.MARGIN:
            self._paused = False
            return k
        self._paused = True
        if self.since_probe >= self.PROBE_EVERY:
            return min(2, self.max_draft)
        return 0

    def drafted(self, proposed: int, accepted: int) -> None:
        self.since_probe = 0
        self.hits = self.DECAY * self.hits + accepted
        self.misses = self.DECAY * self.misses + (1 if accepted < proposed else 0)

    def plain(self) -> None:
        self.since_probe += 1

    def shadow_confirmed(self) -> None:
        pass


def make_policy(name: str, max_draft: int, *, adaptive: bool = True, on_cuda: bool = False,
                verify_cost: Sequence[float] | None = None) -> DraftPolicy:
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
    raise ValueError(f"unknown draft policy {name!r}")

"""The speculation gate under load (`serve -np N`): verify rounds for a batch only while they pay.

Why a cost model. Alone, a sequence's drafter policy sizes its rounds from its own timings. In
a batch every row shares one forward, and on the CPU that forward is compute-bound past a few
rows (docs/cpu.md, "Many rows"): 16 one-row sequences cost several one-row steps, so verify rows
that double a batch's rows can cost more than the tokens they add. mlxcel gates on a count
(`--prompt-lookup-max-batch`, default 2, as the seed page specifies); that count stays a cap, and
under it (or alone, with `--prompt-lookup-max-batch auto`) the gate keeps

- `costs`: the seconds of one batched forward against its rows, measured at server start on the
  loaded model (`measure_costs`: 1 to 64 rows), interpolated between, extrapolated past them;
- two running averages over the batch's sequence turns while it speculates: rows a turn feeds
  (1 for a plain step, 1 + w for a round that verifies w drafted tokens) and tokens it yields
  (1, or 1 + the accepted drafts),

and lets the batch speculate while its tokens per second beat plain steps':

    tokens_per_turn / cost(live * rows_per_turn)  >  (1 + MARGIN) / cost(live)

One live sequence always may (its policy decides). Without measured costs (batches that are not
ragged and exact) the count alone decides (FALLBACK_MAX_BATCH under auto). Output never depends
on the gate: a round yields exactly the target's tokens either way.

Hysteresis: the gate closes at once when the rule (or the count) fails and reopens only after
REOPEN_TICKS consecutive ticks that pass, so a queue at the threshold does not flap. While shut
no round teaches it, so the averages drift back toward their priors (a batch whose prompts turn
from prose to code gets to try again).
"""

from __future__ import annotations

import bisect
import time
from typing import Any

REOPEN_TICKS = 16
MARGIN = 0.05  # speculation must beat plain steps by this much (timing noise, drafting's own cost)
TURN_EMA = 0.02  # weight of one sequence turn in the running averages
DRIFT = 0.01  # per shut tick, how far the averages move back toward their priors
# priors, before any round: a prompt-lookup turn on text that repeats itself now and then
PRIOR_ROWS, PRIOR_TOKENS = 2.5, 1.6
FALLBACK_MAX_BATCH = 2  # no measured costs (batches not ragged and exact): mlxcel's default
COST_ROWS = (1, 2, 4, 8, 16, 32, 64)


class Gate:
    """Verify rounds allowed or not, decided once per scheduler tick from the live count.

    `max_batch`: the most live sequences that may speculate (mlxcel's `--prompt-lookup-max-batch`),
    or None (auto: the cost rule alone; FALLBACK_MAX_BATCH while no `costs` are set)."""

    def __init__(self, max_batch: int | None):
        self.max_batch = max_batch
        self.costs: dict[int, float] = {}
        # >0: prompts prefill in chunks of this many tokens inside the batched forward (set by the
        # scheduler where batches are ragged, so a chunk costs its own rows and no padding)
        self.prefill_chunk = 0
        self.open = True
        self._calm = 0
        self.closings = 0
        self.rows_per_turn = PRIOR_ROWS
        self.tokens_per_turn = PRIOR_TOKENS

    @property
    def measured(self) -> bool:
        return len(self.costs) >= 2

    def cost(self, rows: float) -> float:
        """Seconds of one forward of `rows` rows, from the measured points (linear between them,
        the last segment's slope past them)."""
        xs = sorted(self.costs)
        i = min(max(bisect.bisect_left(xs, rows), 1), len(xs) - 1)
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = self.costs[x0], self.costs[x1]
        return max(y0 + (y1 - y0) * (rows - x0) / (x1 - x0), 1e-9)

    def pays(self, live: int) -> bool:
        """Whether verify rounds at `live` sequences beat plain steps (the rule above)."""
        if live <= 1:
            return True
        cap = self.max_batch if self.max_batch is not None or self.measured else FALLBACK_MAX_BATCH
        if cap is not None and live > cap:
            return False
        if not self.measured:
            return True
        with_rounds = self.tokens_per_turn / self.cost(live * self.rows_per_turn)
        return with_rounds > (1 + MARGIN) / self.cost(live)

    def turn(self, rows: int, tokens: int) -> None:
        """One sequence's turn while the gate is open: the rows it fed, the tokens it yielded."""
        self.rows_per_turn += TURN_EMA * (rows - self.rows_per_turn)
        self.tokens_per_turn += TURN_EMA * (tokens - self.tokens_per_turn)

    def tick(self, live: int) -> bool:
        if not self.pays(live):
            if self.open:
                self.closings += 1
            self.open, self._calm = False, 0
        elif not self.open:
            self._calm += 1
            if self._calm >= REOPEN_TICKS:
                self.open = True
        if not self.open:
            self.rows_per_turn += DRIFT * (PRIOR_ROWS - self.rows_per_turn)
            self.tokens_per_turn += DRIFT * (PRIOR_TOKENS - self.tokens_per_turn)
        return self.open

    def describe(self) -> str:
        """How the gate decides, for the server's startup line."""
        if not self.measured:
            return f"verify rounds while at most {self.max_batch or FALLBACK_MAX_BATCH} are live"
        points = ", ".join(f"{r} rows {self.costs[r] * 1000:.1f} ms" for r in sorted(self.costs) if r in (1, 8, 64))
        count = f"at most {self.max_batch} are live and " if self.max_batch is not None else "they "
        return f"verify rounds while {count}pay at the batch's measured cost ({points})"


def measure_costs(model: Any, vocab: int, rows: tuple[int, ...] = COST_ROWS, repeats: int = 3) -> dict[int, float]:
    """Seconds of one ragged batched forward of each row count on `model` (the fastest of
    `repeats`, after one untimed call that traces the shape): up to 16 short sequences, the
    rows spread over them as plain steps and verify blocks are."""
    import mlx.core as mx

    from .batch import batched_forward
    from .cache import SequenceCache

    seqs = []
    for b in range(min(16, max(rows))):
        c = SequenceCache(model)
        c.prefill([(13 * i + 7 * b + 1) % vocab for i in range(24)])
        seqs.append(c)
    out: dict[int, float] = {}
    for r in rows:
        n = min(r, len(seqs))
        blocks = [[(5 + i) % vocab for i in range(r // n + (1 if b < r % n else 0))] for b in range(n)]
        best = float("inf")
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            mx.eval([x for x in batched_forward(model, seqs[:n], blocks) if x is not None])
            if i:
                best = min(best, time.perf_counter() - t0)
            for s, blk in zip(seqs, blocks):
                s.truncate(len(s.tokens) - len(blk))
        out[r] = best
    return out

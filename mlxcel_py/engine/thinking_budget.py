"""A cap on a reply's thinking (llama-server's `--reasoning-budget N`), as a rule on output tokens.

A reasoning model's reply opens with a think block (the template may open it for the model:
`opened`); once the block holds N tokens without closing, the close (`</think>` as the tokenizer
spells it) is forced one token at a time and the reply then goes on freely. Past the block, or in
a reply that does not begin with one, nothing is constrained.

It speaks the grammar Constraint's interface (`admissible`, `mask_rows`, `commit`, `finished`),
so the round loop treats it as it treats a grammar: a draft is cut where the rule would refuse a
token, and verify row r is masked by the state after the first r drafts, exactly as a plain step
at that position would be; speculative output therefore still equals plain output. The state is
a small tuple advanced by a pure function, so rows are judged without touching the committed
state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

START, THINKING, FREE = "start", "thinking", "free"
State = tuple[str, int, int]  # (phase, thinking tokens so far, tokens of the open/close matched)


class ThinkingBudget:
    def __init__(self, budget: int, open_ids: Sequence[int], close_ids: Sequence[int], *, opened: bool):
        if budget < 0 or not close_ids or not open_ids:
            raise ValueError("a thinking budget needs a budget of 0 or more and the open and close tokens")
        self.budget = budget
        self.open_ids = tuple(int(t) for t in open_ids)
        self.close_ids = tuple(int(t) for t in close_ids)
        self.state: State = (THINKING, 0, 0) if opened else (START, 0, 0)

    def advance(self, state: State, token: int) -> State:
        phase, n, matched = state
        if phase == START:
            if token != self.open_ids[matched]:
                return (FREE, 0, 0)
            return (THINKING, 0, 0) if matched + 1 == len(self.open_ids) else (START, 0, matched + 1)
        if phase == THINKING:
            if token == self.close_ids[matched]:
                matched += 1
            else:
                matched = 1 if token == self.close_ids[0] else 0
            return (FREE, 0, 0) if matched == len(self.close_ids) else (THINKING, n + 1, matched)
        return state

    def forced(self, state: State) -> int | None:
        """The only token allowed in `state` (the close's next one, once the budget is spent)."""
        phase, n, matched = state
        return self.close_ids[matched] if phase == THINKING and n >= self.budget else None

    def admissible(self, tokens: Sequence[int]) -> int:
        state = self.state
        for i, t in enumerate(tokens):
            must = self.forced(state)
            if must is not None and int(t) != must:
                return i
            state = self.advance(state, int(t))
        return len(tokens)

    def mask_rows(self, logits: Any, drafts: Sequence[int] = ()) -> Any:
        import mlx.core as mx

        state, forced = self.state, []
        for r in range(len(drafts) + 1):
            must = self.forced(state)
            forced.append(-1 if must is None else must)
            if r < len(drafts):
                state = self.advance(state, int(drafts[r]))
        if all(f < 0 for f in forced):
            return logits
        rows = mx.array(forced)[:, None]
        keep = (rows < 0) | (mx.arange(logits.shape[-1])[None, :] == rows)
        return mx.where(keep, logits, -mx.inf)

    def commit(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.state = self.advance(self.state, int(t))

    @property
    def finished(self) -> bool:
        return False  # the cap never ends a reply, only its thinking

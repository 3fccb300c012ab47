"""--reasoning-budget N as an output rule (engine/thinking_budget.py): the think block closes
after N tokens, replies that do not think are untouched, and speculative output under the rule
equals plain output under it, greedy and sampled (tiny random-weight model, prompt lookup)."""

from __future__ import annotations

import pytest
from test_engine import engine_for, lookup, prompts, run

from mlxcel_py.engine.thinking_budget import ThinkingBudget
from mlxcel_py.options import SamplingOptions

OPEN, CLOSE = (7,), (40, 41, 42)


def test_the_rule_forces_the_close_once_the_budget_is_spent_and_not_before():
    rule = ThinkingBudget(3, OPEN, CLOSE, opened=True)
    assert rule.admissible([1, 2, 3, 40, 41, 42, 9, 9]) == 8
    assert rule.admissible([1, 2, 3, 4]) == 3  # the fourth thinking token is refused
    assert rule.admissible([1, 40, 41, 42, 5, 5, 5, 5]) == 8  # closed early by the model: free after
    assert rule.admissible([1, 40, 9, 2]) == 3  # a broken-off close counts as thinking: 2 is over
    assert rule.admissible([1, 40, 9, 40]) == 4  # the forced close may begin there
    rule.commit([1, 2, 3, 40])
    assert rule.admissible([42]) == 0 and rule.admissible([41, 42]) == 2  # the close goes on
    waiting = ThinkingBudget(2, OPEN, CLOSE, opened=False)
    assert waiting.admissible([5, 5, 5, 5]) == 4  # no think block at the start: nothing to cap
    assert waiting.admissible([7, 1, 1, 1]) == 3  # it opens one: capped at 2


@pytest.mark.parametrize("sampling", [SamplingOptions(temp=0.0), SamplingOptions(temp=0.9, seed=5)])
def test_speculative_under_a_budget_equals_plain_under_it(tiny, sampling):
    plain, spec = engine_for(tiny), engine_for(tiny, lookup())
    drafted = 0
    for i, p in enumerate(prompts(12, seed=11)):
        budget = 1 + i % 8  # budgets that end inside a draft as well as between rounds
        kw = dict(max_tokens=30, sampling=sampling, ignore_eos=True)
        a, _ = run(plain, p, **kw, constraint=ThinkingBudget(budget, OPEN, CLOSE, opened=True))
        b, g = run(spec, p, **kw, constraint=ThinkingBudget(budget, OPEN, CLOSE, opened=True))
        assert a == b
        drafted += g.stats.proposed
        cut = next((i for i in range(len(a) - 2) if tuple(a[i : i + 3]) == CLOSE), None)
        assert cut is not None and cut <= budget  # closed by the budget (or by the model before it)
        free, _ = run(plain, p, **kw)
        assert free[:cut] == a[:cut]  # before the cap the reply is the unconstrained one
    assert drafted > 0

"""The speculation gate's cost model (engine.gate): verify rounds for a batch while their tokens per
second beat plain steps' at the measured cost of a wider forward; a fixed count where given."""

from __future__ import annotations

import pytest

from mlxcel_py.engine import gate as gate_mod
from mlxcel_py.engine.gate import REOPEN_TICKS, Gate, measure_costs

# a CPU-like curve: 3 ms fixed, then 0.5 ms a row (compute-bound past a few rows)
LINEAR = {r: 0.003 + 0.0005 * r for r in (1, 2, 4, 8, 16, 32, 64)}


def measured(costs=LINEAR, rows=2.5, tokens=1.6, max_batch=None) -> Gate:
    g = Gate(max_batch)
    g.costs = dict(costs)
    g.rows_per_turn, g.tokens_per_turn = rows, tokens
    return g


def test_cost_interpolates_between_points_and_extrapolates_past_them():
    g = measured({1: 1.0, 8: 2.0, 64: 9.0})
    assert g.cost(1) == 1.0 and g.cost(8) == 2.0
    assert g.cost(4.5) == pytest.approx(1.5)
    assert g.cost(36) == pytest.approx(5.5)
    assert g.cost(128) == pytest.approx(9.0 + 64 * 7 / 56)  # the last segment's slope


def test_rounds_pay_while_their_tokens_per_second_beat_plain_steps():
    g = measured(rows=4.0, tokens=2.0)  # w = 3 drafted, 1 accepted a turn on average
    # live 2: cost(8) / cost(2) = 7 / 4 = 1.75 < 2 tokens a turn / 1.05
    assert g.pays(2)
    # live 16: cost(64) / cost(16) = 35 / 11 = 3.2 > 2: plain steps win
    assert not g.pays(16)
    # one sequence always may: its own policy sizes its rounds
    assert g.pays(1)
    # the boundary follows the acceptance: a drafter that lands more keeps rounds on at 16 live
    assert measured(rows=4.0, tokens=3.6).pays(16)
    assert not measured(rows=4.0, tokens=1.2).pays(2)


def test_turns_move_the_averages_and_close_the_gate_on_poor_acceptance():
    g = measured()
    assert g.tick(2)
    for _ in range(400):  # every turn verifies 6 drafts and keeps none
        g.turn(7, 1)
    assert g.rows_per_turn == pytest.approx(7, abs=0.01) and g.tokens_per_turn == pytest.approx(1, abs=0.01)
    assert not g.tick(2) and g.closings == 1
    assert g.tick(1) is False  # closed: reopens only after a calm spell


def test_a_shut_gate_drifts_back_to_its_priors_and_tries_again():
    g = measured(rows=7.0, tokens=1.0)
    ticks = 0
    while not g.tick(3):
        ticks += 1
        assert ticks < 2000, "never reopened"
    assert ticks >= REOPEN_TICKS - 1
    assert g.tokens_per_turn > 1.0 and g.rows_per_turn < 7.0


def test_the_count_caps_the_cost_rule_and_gates_alone_without_costs():
    capped = measured(rows=4.0, tokens=3.6, max_batch=3)  # rounds pay at 16 live, the count says 3
    assert capped.pays(3) and not capped.pays(4)
    assert not measured(rows=4.0, tokens=1.2, max_batch=3).pays(2)  # under the count, the cost rule
    assert "while at most 3 are live and pay at the batch's measured cost" in capped.describe()
    counted = Gate(3)  # batches not ragged and exact: nothing measured, the count alone
    assert counted.pays(3) and not counted.pays(4)
    assert "while at most 3 are live" in counted.describe()
    bare = Gate(None)  # auto, nothing measured: mlxcel's default count
    assert bare.pays(gate_mod.FALLBACK_MAX_BATCH) and not bare.pays(gate_mod.FALLBACK_MAX_BATCH + 1)
    assert "at most 2 are live" in bare.describe()
    assert (
        "they pay at the batch's measured cost (1 rows 3.5 ms, 8 rows 7.0 ms, 64 rows 35.0 ms)" in measured().describe()
    )


@pytest.mark.real
def test_measured_costs_on_the_default_model(real):
    """Every row count timed on the loaded model; a 64-row forward costs more than a one-row step
    and less than 64 of them, and the caches the probe used are left as they were."""
    costs = measure_costs(real.model, real.vocab_size or 2, rows=(1, 8, 64), repeats=2)
    assert set(costs) == {1, 8, 64} and all(c > 0 for c in costs.values())
    assert costs[1] < costs[64] < 64 * costs[1]

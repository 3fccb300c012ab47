import pytest

from mlxcel_py.engine.policy import CostPolicy, FixedPolicy, GatedPolicy, GradedPolicy, make_policy


def test_graded_starts_full_and_stays_full_on_hits():
    p = GradedPolicy(7)
    assert p.budget() == 7
    p.drafted(7, 7)
    assert p.budget() == 7


def test_graded_shrinks_with_ema_and_pauses_after_three_misses_doubling_to_32():
    p = GradedPolicy(7)
    for _ in range(20):
        p.drafted(7, 1)
    assert p.budget() == 4  # ema -> 1: round(2*1)+2
    pauses = []
    for _ in range(7):
        for _ in range(3):
            assert p.budget() > 0
            p.drafted(p.budget(), 0)
        n = 0
        while p.budget() == 0:
            p.plain()
            n += 1
        pauses.append(n)
    assert pauses == [4, 8, 16, 32, 32, 32, 32]
    p.drafted(2, 1)  # a landing round resets the pause length
    for _ in range(3):
        p.drafted(p.budget(), 0)
    n = 0
    while p.budget() == 0:
        p.plain()
        n += 1
    assert n == 4


def test_non_adaptive_always_max():
    p = make_policy("graded", 7, adaptive=False)
    assert isinstance(p, FixedPolicy)
    for _ in range(5):
        p.drafted(7, 0)
        assert p.budget() == 7


def test_auto_picks_gated_on_cuda_graded_elsewhere():
    assert isinstance(make_policy("auto", 7, on_cuda=True), GatedPolicy)
    assert isinstance(make_policy("auto", 7, on_cuda=False), GradedPolicy)


def test_gated_probation_full_blocks_and_shadow_resume():
    p = GatedPolicy(7)
    assert p.budget() == 2  # narrow, on probation
    p.drafted(2, 2)  # whole narrow block lands: probation ends
    p.drafted(2, 2)
    assert p.budget() == 7  # ema >= 1.5 -> full block
    for _ in range(3):
        p.drafted(7, 0)
    assert p.paused and p.budget() == 0
    p.shadow_confirmed()
    assert not p.paused and p.budget() == 2 and p.probation
    p.drafted(2, 0)  # a miss on probation pauses at once
    assert p.paused


def test_cost_policy_declines_below_break_even_and_probes():
    # verify cost grows fast with width: drafting only pays with high acceptance
    costs = [0.0, 1.0] + [1.0 + 0.3 * w for w in range(1, 8)]
    p = CostPolicy(7, costs)
    assert p.size(7, 5) > 0 and p.budget() == 7
    for _ in range(10):
        k = p.size(7, 2) or 2
        p.drafted(k, 0)
    assert p.size(7, 2) == 0 and p.paused
    assert p.size(7, 5) > 0  # a long match keeps its own, higher acceptance estimate
    probes = []
    for _ in range(40):
        k = p.size(7, 2)
        if k:
            probes.append(k)
            p.drafted(k, 0)
    assert 3 <= len(probes) <= 6 and set(probes) == {2}
    for _ in range(80):  # the reply starts copying: the short-match estimate climbs back
        k = p.size(7, 2) or 2
        p.drafted(k, k)
    assert p.size(7, 2) >= 5 and not p.paused


def test_cost_policy_longer_matches_get_wider_blocks():
    p = CostPolicy(16)
    assert p.size(16, 8) > p.size(16, 3) > p.size(16, 2) >= 0
    assert p.size(3, 8) == 3  # never more than was proposed


def test_cost_policy_follows_measured_forward_times():
    p = CostPolicy(7, [0.0, 1.0] + [1.0 + 0.02 * w for w in range(1, 8)])
    assert p.size(7, 5) == 7
    for _ in range(5):  # this run's contexts make wide verifies far dearer than warmup said
        p.timed(1, 0.05)
        p.timed(8, 0.40)
    assert p.cost(8) == pytest.approx(8.0)
    assert p.size(7, 5) < 7


def test_cost_policy_cheap_verify_uses_wide_blocks():
    p = CostPolicy(7, [0.0, 1.0] + [1.0 + 0.02 * w for w in range(1, 8)])
    for _ in range(10):
        p.size(7, 3)
        p.drafted(7, 7)
    assert p.size(7, 3) == 7

"""The composite drafter (`generate --prompt-lookup --draft-model DIR`): prompt lookup where the
context has a match, the model drafter elsewhere, one round loop.

A full-model drafter that is the target itself drafts only right tokens, so any round it loses
track of the context (after lookup rounds it did not draft) shows as a rejected draft: every one
of its drafts must be accepted. An EAGLE-3 drafter (random weights) proves the hidden-state
catch-up path and the p/q rule; greedy output equals plain everywhere.
"""

from __future__ import annotations

import subprocess

import pytest
import tiny_models
from conftest import mlxcel_cmd
from test_dflash import plain_engine, session
from test_engine import run
from test_families import copy_prompts

from mlxcel_py.commands._options import build_options
from mlxcel_py.drafters.base import Proposal
from mlxcel_py.errors import UsageError
from mlxcel_py.options import SamplingOptions
from mlxcel_py.validate import validate

QWEN3 = tiny_models.QWEN3


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("composite")
    return {
        "target": tiny_models.build(root / "target", QWEN3, seed=1, scale=0.5),
        "eagle3": tiny_models.eagle3_checkpoint(root / "eagle3", tiny_models.eagle3_config(QWEN3)),
    }


def both_sides(s, prompts, n, sampled=False):
    """Greedy output equals plain, sampled runs reach full length; returns the proposals each side
    made and the rounds' (proposed, accepted)."""
    plain = plain_engine(s)
    lookup = model = 0
    proposed = accepted = 0
    for i, p in enumerate(prompts):
        for sampling in (SamplingOptions(), SamplingOptions(temp=0.8, seed=i))[: 2 if sampled else 1]:
            drafter = s.drafters.make(private=True)
            a, _ = run(plain, p, max_tokens=n, sampling=sampling, ignore_eos=True)
            b, g = run(s.engine, p, max_tokens=n, sampling=sampling, ignore_eos=True, drafter=drafter)
            if sampling.greedy:
                assert a == b, i
            else:
                assert len(b) == n
            assert g.stats.draft_kind == s.drafters.kind
            lookup, model = lookup + drafter.from_lookup, model + drafter.from_model
            proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    return lookup, model, proposed, accepted


def test_validation_makes_a_composite_and_keeps_the_other_refusals(dirs):
    opts = {"prompt": "x", "model": str(dirs["target"]), "prompt_lookup": True, "draft_model": str(dirs["eagle3"])}
    run_cfg = validate(build_options("generate", {**opts, "draft_block_size": 2}))
    d = run_cfg.draft
    assert d.lookup_first and d.block_size == 2 and d.block_explicit and d.lookup.max_draft >= 2
    for extra, message in (
        ({"draft_kind": "suffix"}, "--prompt-lookup conflicts with --draft-kind suffix"),
        ({"draft_model": None, "draft_kind": "full-model"}, "--prompt-lookup conflicts with --draft-kind full-model"),
        ({"draft_model": None, "draft_block_size": 4}, "does not apply to --prompt-lookup"),
    ):
        with pytest.raises(UsageError, match=message):
            validate(build_options("generate", {**opts, **extra}))


def test_a_target_copy_as_the_model_side_is_never_wrong_after_lookup_rounds(dirs):
    """The model drafter must follow the context through rounds the lookup side drafted."""
    s = session(dirs["target"], draft_model=dirs["target"], prompt_lookup=True, draft_block_size=3)
    assert s.drafters.kind == "prompt-lookup+full-model"
    plain = plain_engine(s)
    lookup = model = 0
    for i, p in enumerate(copy_prompts(6, seed=3)):
        drafter = s.drafters.make(private=True)
        a, _ = run(plain, p, max_tokens=40, ignore_eos=True)
        b, g = run(s.engine, p, max_tokens=40, ignore_eos=True, drafter=drafter)
        assert a == b, i
        lookup, model = lookup + drafter.from_lookup, model + drafter.from_model
    assert lookup > 0 and model > 0, (lookup, model)


def test_model_side_rounds_of_a_target_copy_are_all_accepted(dirs):
    """Count the model side's own acceptance: wrap its drafter to see each of its proposals judged."""
    s = session(dirs["target"], draft_model=dirs["target"], prompt_lookup=True, draft_block_size=3)
    plain = plain_engine(s)
    for p in copy_prompts(4, seed=5):
        drafter = s.drafters.make(private=True)
        model_side = drafter.model
        drafted: list[list[int]] = []
        real = model_side.propose

        def spy(context, limit, decider, real=real, drafted=drafted):
            out = real(context, limit, decider)
            drafted.append((len(context), list(out.tokens)))
            return out

        model_side.propose = spy
        a, _ = run(plain, p, max_tokens=40, ignore_eos=True)
        b, _ = run(s.engine, p, max_tokens=40, ignore_eos=True, drafter=drafter)
        assert a == b
        full = list(p) + a
        for at, tokens in drafted:  # each model draft is exactly what the target said next
            assert tokens == full[at : at + len(tokens)], (at, tokens)
        assert drafted


def test_eagle3_side_catches_up_and_sampling_keeps_pq(dirs):
    s = session(dirs["target"], draft_model=dirs["eagle3"], prompt_lookup=True)
    assert s.drafters.kind == "prompt-lookup+eagle3"
    lookup, model, proposed, _ = both_sides(s, copy_prompts(4, seed=1), 30, sampled=True)
    assert lookup > 0 and model > 0 and proposed > 0


def test_cli_generate_with_both_equals_plain(dirs, cli_env):
    base = [*mlxcel_cmd(), "generate", "-m", str(dirs["target"]), "-p", "abcabcabc abc", "-n", "24", "--ignore-eos"]
    plain = subprocess.run(base, capture_output=True, text=True, env=cli_env, timeout=300)
    both = subprocess.run(
        [*base, "--prompt-lookup", "--draft-model", str(dirs["eagle3"]), "--profile", "--verbose"],
        capture_output=True, text=True, env=cli_env, timeout=300,
    )  # fmt: skip
    assert plain.returncode == both.returncode == 0, both.stderr[-2000:]
    assert both.stdout == plain.stdout
    assert "speculative=prompt-lookup+eagle3" in both.stderr and "prompt-lookup+eagle3" in both.stderr


def test_the_break_even_policy_drafts_the_width_that_pays_pauses_when_none_does_and_probes():
    from mlxcel_py.engine.policy import BreakEvenPolicy

    g = BreakEvenPolicy(3)
    for width, seconds in ((1, 1.0), (2, 1.05), (3, 1.2), (4, 1.3)):  # this CPU's verify shape
        g.timed(width, seconds)
    g.draft_timed(3, 0.15)  # a draft step: 0.05 of a plain step
    assert abs(g.draft_cost() - 0.05) < 1e-9 and g.cost(3) == 1.2
    for _ in range(20):
        g.drafted(3, 3)  # every draft accepted: the full width pays best
    assert g.budget() == 3
    for i in range(60):  # two in five accepted: one draft a round pays, three do not
        g.drafted(1, int(i % 5 < 2))
    assert g.budget() == 1 and abs(g.alpha - 0.4) < 0.1, g.alpha
    for _ in range(100):
        g.drafted(1, 0)  # nothing accepted: no width beats a plain step
    assert g.budget() == 0 and g.paused and g.backoff.left == 4
    for _ in range(4):
        g.plain()
    assert not g.paused and g.budget() == 3  # the probe, at full width
    g.drafted(3, 0)
    assert g.budget() == 0 and g.backoff.left == 8  # still nothing: a pause twice as long
    for _ in range(8):
        g.plain()
    assert g.budget() == 3
    for _ in range(20):
        g.drafted(3, 3)  # it pays again: drafting goes on and the next pause starts short
    assert g.budget() == 3 and g.backoff.length == 4


def test_the_break_even_policy_counts_a_slow_drafter_against_its_drafts():
    """The same acceptance pays with a cheap draft step and not with one as dear as a plain step."""
    from mlxcel_py.engine.policy import BreakEvenPolicy

    def width(draft_seconds):
        g = BreakEvenPolicy(3)
        g.timed(1, 1.0)
        g.timed(2, 1.05)
        g.draft_timed(1, draft_seconds)
        for i in range(60):
            g.drafted(1, int(i % 2 == 0))  # half accepted
        return g.budget()

    assert width(0.05) >= 1 and width(1.0) == 0


def test_a_drafter_that_guesses_badly_is_paused_and_lookup_still_drafts(dirs):
    """A random-weight EAGLE-3 drafter is almost never right: the model side drafts in few rounds
    (its misses soon make no width pay) while the rounds with a lookup match still draft."""
    s = session(dirs["target"], draft_model=dirs["eagle3"], prompt_lookup=True)
    plain = plain_engine(s)
    rounds = model = lookup = 0
    for i, p in enumerate(copy_prompts(4, seed=9)):
        drafter = s.drafters.make(private=True)
        a, _ = run(plain, p, max_tokens=60, ignore_eos=True)
        b, g = run(s.engine, p, max_tokens=60, ignore_eos=True, drafter=drafter)
        assert a == b, i
        rounds, model, lookup = rounds + g.stats.rounds, model + drafter.from_model, lookup + drafter.from_lookup
        assert drafter.gate.alpha < drafter.gate.PRIOR_ALPHA or drafter.from_model == 0, i
    assert lookup > 0
    assert model < rounds / 3, (model, rounds)  # ungated, every round without a match would draft


def test_eagle3_alone_runs_under_the_break_even_policy(dirs):
    """A drafter whose drafts do not pay pauses (random weights: almost never right)."""
    s = session(dirs["target"], draft_model=dirs["eagle3"])
    plain = plain_engine(s)
    p = copy_prompts(1, seed=2)[0]
    a, _ = run(plain, p, max_tokens=60, ignore_eos=True)
    b, g = run(s.engine, p, max_tokens=60, ignore_eos=True)
    assert a == b
    # it drafts, then pauses: how often it probes again follows measured times (7 of 60 rounds
    # on a quiet machine, 31 beside a loaded one), so only the pausing itself is asserted
    assert g.stats.policy == "break-even" and 0 < g.stats.drafted_rounds < g.stats.rounds, g.stats
    assert g.stats.paused_rounds > 0, g.stats


def test_bench_plans_the_composite_beside_each_drafter_alone(dirs):
    from mlxcel_py.bench.checks import validate_bench
    from mlxcel_py.commands._options import build_bench_options

    params = {"draft_model": str(dirs["eagle3"]), "prompt_lookup": True, "max_tokens": 16}
    plan = validate_bench(build_options("bench", params), build_bench_options(params))
    assert [(d.kind, d.lookup_first) for d in plan.drafts] == [
        ("full-model", False),  # the folder's kind (eagle3) is resolved when the session loads it
        ("prompt-lookup", False),
        ("full-model", True),
    ]


class _StubLookup:
    """A lookup side with no n-gram match ever; its fallback drafts `fallback` (none: [])."""

    def __init__(self, fallback: list[int]):
        self.fallback = fallback

    def begin(self, context, target=None): ...

    def commit(self, context): ...

    def propose(self, context, limit, decider, fallback=True):
        return Proposal(self.fallback, match_len=1) if fallback and self.fallback else Proposal([])


class _StubModel:
    """A model side that drafts one token, 9, every round it is asked."""

    kind = "stub"
    tree_margin = 0.0

    def begin(self, context, target=None): ...

    def commit(self, context): ...

    def propose(self, context, limit, decider):
        return Proposal([9])


def test_the_side_with_more_tokens_a_second_takes_the_rounds_without_a_match():
    """Rate: a side's recent rounds' tokens over their seconds, trusted after KNOWN rounds; the
    newest rounds weigh most, so a change of text turns the choice."""
    from mlxcel_py.drafters.composite import Rate

    slow, fast = Rate(), Rate()
    for _ in range(Rate.KNOWN - 1):
        slow.add(1, 0.004)
        fast.add(2, 0.004)
    assert not slow.known and not fast.known
    slow.add(1, 0.004)
    fast.add(2, 0.004)
    assert slow.known and fast.rate > slow.rate and abs(fast.rate - 500) < 1e-6
    for _ in range(30):  # the slow side's text got easy
        slow.add(4, 0.004)
    assert slow.rate > fast.rate


def test_rounds_without_a_match_go_to_the_side_that_gives_more_tokens_a_second(monkeypatch):
    """Stub sides and a fake clock: both sides' drafts are accepted every other round (1.5 tokens a
    round: the model side's break-even policy keeps drafting), but a model round takes 3.6 ms and a
    fallback round 2.7 ms. Each side is tried, then the fallback takes the rounds without a
    match, the model drafting again only every PROBE_EVERY of them."""
    from mlxcel_py.drafters import composite
    from mlxcel_py.engine.policy import FixedPolicy

    now = [0.0]
    monkeypatch.setattr(composite.time, "perf_counter", lambda: now[0])
    d = composite.CompositeDrafter(_StubLookup(fallback=[7]), _StubModel(), 2, lambda: FixedPolicy(7))
    context = [1, 2, 3]
    d.begin(context)
    sides = []
    for i in range(120):
        p = d.propose(context, 7, None)
        side = d.last[0]
        sides.append(side)
        context = context + ([p.tokens[0], 5] if i % 2 else [5])  # accepted every other round
        now[0] += 0.0036 if side == "model" else 0.0027
        assert p.tokens
    assert sides[:2] == ["model", "fallback"]  # each side once, the model first
    late = sides[40:]
    assert late.count("fallback") > 0.85 * len(late) and "model" in late, late
    assert d.rates["fallback"].rate > d.rates["model"].rate and not d.gate.paused


def test_the_model_side_is_priced_by_timed_verify_forwards_kept_across_sequences(monkeypatch):
    """The engine times only its own (fixed) policy: the composite times the forward after each
    of its proposals itself (a verify of len(draft) + 1 rows, or a plain step) into prices its
    gate reads and that outlive a sequence. With a 2-row verify at 1.9 plain steps and half its
    one-token drafts kept, drafting loses (1.5 tokens for 2 steps' time): the gate stops, where
    the default shape (1.07 a 2-row verify) kept it drafting."""
    from mlxcel_py.drafters import composite
    from mlxcel_py.engine.policy import FixedPolicy, VerifyCost

    now = [0.0]
    monkeypatch.setattr(composite.time, "perf_counter", lambda: now[0])
    prices = VerifyCost(7)
    d = composite.CompositeDrafter(_StubLookup(fallback=[]), _StubModel(), 1, lambda: FixedPolicy(7), prices)
    assert d.gate.cost(2) < 1.1  # the default shape until timed
    context = [1, 2, 3]
    d.begin(context)
    drafted = []
    for i in range(200):
        p = d.propose(context, 7, None)
        drafted.append(bool(p.tokens))
        now[0] += 0.019 if p.tokens else 0.010  # the forward the engine runs on the proposal
        context = context + ([9, 5] if p.tokens and i % 2 else [5])
    assert prices.seconds.keys() >= {1, 2} and abs(d.gate.cost(2) - 1.9) < 1e-6
    assert sum(drafted[-100:]) < 15, drafted[-100:]  # probes only
    d.begin([4, 5, 6])  # a new sequence: its rounds start afresh, the prices do not
    assert d.gate.cost is prices and abs(d.gate.cost(2) - 1.9) < 1e-6


def test_a_composite_calibrates_its_verify_widths_at_warmup(dirs):
    """registry.calibrates: warmup times every verify width for a composite too, and its Source
    hands the calibration to its drafters' shared prices."""
    from mlxcel_py.drafters import registry

    s = session(dirs["target"], draft_model=dirs["eagle3"], prompt_lookup=True)
    assert registry.calibrates(s.engine.drafters.config)
    s.engine.warmup([1, 2, 3, 4], calibrate=True)
    s.engine.make_policy()
    measured = s.engine.verify_cost
    assert measured and s.engine.drafters.prices.shape[3] == max(measured[1:4])

"""Context shift (llama-server's --context-shift, engine/context_shift.py): a generation that fills
its window drops part of the context and goes on. After each shift the output is what a fresh
prompt of the shifted tokens gives, and speculative decoding shifts at the same tokens as plain
decoding, so its output stays equal token for token."""

from __future__ import annotations

import pytest
from test_draft_model import full, tiny_draft  # noqa: F401  (a fixture)
from test_engine import engine_for, lookup, prompts, run

from mlxcel_py.engine.context_shift import ContextShift
from mlxcel_py.options import SamplingOptions

WINDOW = 40
N = 90  # tokens generated: two or more shifts of a 40-token window


def shifting(eng, window=WINDOW):
    eng.context_length = window
    return eng


def by_hand(eng, prompt, shift, n):
    """The oracle: decode plainly until the window is full, drop the planned span, start a fresh
    request on the shifted tokens; repeat."""
    seq, out = list(prompt), []
    while len(out) < n:
        if len(seq) >= eng.context_length:
            keep, discard = shift.plan(len(seq), len(prompt), eng.context_length)
            del seq[keep : keep + discard]
            continue
        fresh, _ = run(eng, seq, max_tokens=min(eng.context_length - len(seq), n - len(out)), ignore_eos=True)
        seq += fresh
        out += fresh
    return out


@pytest.mark.parametrize("shift", [ContextShift(keep=3), ContextShift(keep=-1), ContextShift(keep=0, discard=5)])
def test_after_a_shift_the_output_is_a_fresh_prompt_of_the_shifted_tokens(tiny, shift):
    eng = shifting(engine_for(tiny))
    prompt = prompts(1, seed=4)[0][:12]
    toks, g = run(eng, prompt, max_tokens=N, ignore_eos=True, context_shift=shift)
    assert len(toks) == N and g.finish_reason == "length"
    assert g.stats.context_shifts >= 2
    assert toks == by_hand(eng, prompt, shift, N)


def test_without_a_shift_the_window_ends_the_generation(tiny):
    eng = shifting(engine_for(tiny))
    prompt = prompts(1, seed=4)[0][:12]
    toks, g = run(eng, prompt, max_tokens=N, ignore_eos=True)
    assert len(toks) == WINDOW - len(prompt) and g.stats.context_shifts == 0


@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_speculative_output_equals_plain_across_shifts(tiny, tiny_draft, temp):  # noqa: F811
    shift = ContextShift(keep=2)
    sampling = SamplingOptions(temp=temp, seed=7)
    plain = shifting(engine_for(tiny))
    spec_engines = [shifting(engine_for(tiny, lookup(max_draft=7)))]
    if temp == 0.0:  # a model drafter's own cache restarts at each shift (greedy: exact)
        spec_engines.append(shifting(engine_for(tiny, full(4), draft_model=tiny_draft.model)))
    for p in prompts(3, seed=11):
        p = p[:16]
        a, ga = run(plain, p, max_tokens=N, ignore_eos=True, sampling=sampling, context_shift=shift)
        assert ga.stats.context_shifts >= 2
        for spec in spec_engines:
            b, gb = run(spec, p, max_tokens=N, ignore_eos=True, sampling=sampling, context_shift=shift)
            assert a == b
            assert gb.stats.context_shifts == ga.stats.context_shifts and gb.stats.drafted_rounds > 0


def test_a_plan_keeps_the_head_and_drops_half_of_the_rest():
    assert ContextShift(keep=4).plan(64, 10, 64) == (4, 29)  # 59 fed after the head: half go
    assert ContextShift(keep=-1).plan(64, 10, 64) == (10, 26)  # the whole prompt stays
    assert ContextShift(keep=100).plan(64, 10, 64) == (60, 1)  # at most window - 4 stay; one goes
    assert ContextShift(keep=0, discard=7).plan(64, 10, 64) == (0, 7)

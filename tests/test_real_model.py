"""The real default model: speculative == plain token for token, every policy, full-accept path."""

from __future__ import annotations

import pytest
from test_engine import engine_for, lookup, run

from mlxcel_py.formats.prompting import prompt_ids
from mlxcel_py.options import SamplingOptions

pytestmark = pytest.mark.real


_plain_outputs: dict = {}


def _plain(real, ids: list[int]) -> list[int]:
    """Plain decoding's tokens, computed once per prompt for every policy's comparison."""
    key = tuple(ids)
    if key not in _plain_outputs:
        _plain_outputs[key] = run(engine_for(real), ids, max_tokens=40)[0]
    return _plain_outputs[key]


@pytest.mark.parametrize("policy,adaptive", [("auto", True), ("gated", True), ("cost", True), ("graded", False)])
def test_prompt_lookup_equals_plain_on_workloads(real, workloads, policy, adaptive):
    spec = engine_for(real, lookup(policy, adaptive))
    spec.warmup(calibrate=policy == "cost")
    accepted = 0
    for item in workloads[::4]:  # one of each kind and several sources
        ids = prompt_ids(real.tokenizer, item["prompt"])
        b, g = run(spec, ids, max_tokens=40)
        assert _plain(real, ids) == b, item["source"]
        accepted += g.stats.accepted
    assert accepted > 0


def test_seeded_sampling_equals_plain_on_real_model(real, workloads):
    s = SamplingOptions(temp=0.8, top_p=0.95, seed=7)
    plain = engine_for(real)
    spec = engine_for(real, lookup("graded", adaptive=False))
    ids = prompt_ids(real.tokenizer, workloads[0]["prompt"])
    assert run(plain, ids, max_tokens=40, sampling=s)[0] == run(spec, ids, max_tokens=40, sampling=s)[0]

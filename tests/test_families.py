"""Every cache kind decodes and speculates exactly: hybrid (Gated DeltaNet), sliding-window,
recurrent and conv-state families, built as tiny random models (tiny_models.py).

Random weights prove exactness and mechanics (both accept and reject paths ran, caches equal
plain decoding's after every rollback), never acceptance rates.
"""

from __future__ import annotations

import random
from dataclasses import replace

import mlx.core as mx
import pytest
import tiny_models
from conftest import verify_round
from test_draft_model import full
from test_engine import engine_for, lookup, run

from mlxcel_py.engine.cache import SequenceCache
from mlxcel_py.engine.sampling import Decider
from mlxcel_py.models import loading
from mlxcel_py.models.cache_kinds import describe_kinds, rollback_kind
from mlxcel_py.options import SamplingOptions

FAMILIES = list(tiny_models.FAMILIES)
_loaded: dict = {}


@pytest.fixture(scope="session")
def family_models(tmp_path_factory):
    def get(name: str, *, seed: int = 0, scale: float | None = None):
        key = (name, seed, scale)
        if key not in _loaded:
            folder = tmp_path_factory.mktemp(f"{name}-{seed}") / "model"
            tiny_models.build(folder, tiny_models.FAMILIES[name], seed=seed, scale=scale)
            _loaded[key] = loading.load(loading.resolve(str(folder)))
        return _loaded[key]

    return get


def copy_prompts(n: int, seed: int) -> list[list[int]]:
    """Prompts that repeat themselves, so prompt lookup finds drafts (right or wrong)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randint(0, 255) for _ in range(rng.randint(6, 14))]
        out.append(base * 2 + [rng.randint(0, 255) for _ in range(3)] + base[: rng.randint(3, len(base))])
    return out


def test_families_cover_every_rollback_kind(family_models):
    kinds = {rollback_kind(c) for name in FAMILIES for c in SequenceCache(family_models(name).model).layers}
    assert kinds == {"trim", "window", "state", "list"}
    assert describe_kinds(SequenceCache(family_models("falcon_h1").model).layers) == "state x2, trim x2"
    assert describe_kinds(SequenceCache(family_models("recurrent_gemma").model).layers) == "state x2, window x1"


@pytest.mark.parametrize("name", FAMILIES)
def test_plain_decoding_and_warmup(family_models, name):
    lm = family_models(name)
    eng = engine_for(lm, lookup("graded", adaptive=False))
    eng.warmup(calibrate=True)  # every verify width, rolled back through the checkpoint
    assert eng.verify_cost is not None and len(eng.verify_cost) == 9
    toks, g = run(engine_for(lm), copy_prompts(1, 0)[0], max_tokens=40, ignore_eos=True)
    assert len(toks) == 40 and g.finish_reason == "length"


@pytest.mark.parametrize("name", FAMILIES)
def test_prompt_lookup_equals_plain_greedy_and_seeded(family_models, name):
    lm = family_models(name)
    plain = engine_for(lm)
    proposed = accepted = 0
    for policy, adaptive in [("graded", False), ("cost", True)]:
        spec = engine_for(lm, lookup(policy, adaptive))
        spec.warmup(calibrate=policy == "cost")
        for i, p in enumerate(copy_prompts(6, seed=len(name))):
            s = SamplingOptions() if i % 2 == 0 else SamplingOptions(temp=0.9, seed=i)
            a, _ = run(plain, p, max_tokens=32, sampling=s, ignore_eos=True)
            b, g = run(spec, p, max_tokens=32, sampling=s, ignore_eos=True)
            assert a == b, (name, policy, i)
            proposed += g.stats.proposed
            accepted += g.stats.accepted
    assert accepted > 0 and proposed > accepted  # full accepts and partial accepts both ran


def logical_rows(c) -> list:
    """A layer's content as decoding sees it: KV rows in time order (the window's last max_size),
    or the state arrays."""
    kind = rollback_kind(c)
    if kind == "list":
        return [row for part in c.caches for row in logical_rows(part)]
    if kind == "trim":
        return [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]] if c.keys is not None else []
    if kind == "window":
        if c.keys is None:
            return []
        n = min(c.offset, c.max_size)
        return [c._temporal_order(c.keys)[..., -n:, :], c._temporal_order(c.values)[..., -n:, :], c.offset]
    return [a for a in c.state if isinstance(a, mx.array)] + [a for a in getattr(c, "cache", []) if a is not None]


def rows_ignore_height(model) -> bool:
    """Whether this model's float32 matmuls give a row the same bits in a block of any height up to
    8. OpenBLAS's AVX-512 kernels do at these sizes; its Haswell ones (a CPU without AVX-512, or
    OPENBLAS_CORETYPE=Haswell) round rows by their place in the block."""
    lin = next(m for _, m in model.named_modules() if type(m).__name__ == "Linear")
    x = mx.random.normal((8, lin.weight.shape[1]), key=mx.random.key(0))
    full = lin(x)
    return all(mx.array_equal(lin(x[:m]), full[:m]).item() for m in range(1, 8))


def assert_same_state(got: SequenceCache, want: SequenceCache, *, exact: bool = True):
    assert got.tokens == want.tokens
    for i, (a, b) in enumerate(zip(got.layers, want.layers)):
        ra, rb = logical_rows(a), logical_rows(b)
        assert len(ra) == len(rb), i
        for x, y in zip(ra, rb):
            if isinstance(x, mx.array):
                same = mx.array_equal(x, y) if exact else mx.allclose(x, y, rtol=1e-5, atol=1e-5)
                assert x.shape == y.shape and same.item(), f"layer {i} ({type(a).__name__}) differs"
            else:
                assert x == y


@pytest.mark.parametrize("name", FAMILIES)
def test_rollback_leaves_the_state_plain_decoding_has(family_models, name):
    """Random drafts (mostly wrong) through verify rounds; after each rollback every layer equals,
    array for array, a cache that decoded the committed tokens one at a time: same shapes, offsets
    and positions exactly, values to float rounding. Values are not bit-equal in general even
    without any rollback: the CPU BLAS rounds a 1-row product differently from a block's, and a
    ring buffer sums attention in rotated order (test_rollback_is_bit_exact_against_the_same_blocks
    checks the rollback itself bit for bit)."""
    lm = family_models(name)
    p = copy_prompts(1, seed=3)[0]
    cache = SequenceCache(lm.model)
    cache.prefill(p[:-1])
    plain = SequenceCache(lm.model)
    plain.prefill(p[:-1])
    history = list(p)
    dec = Decider(SamplingOptions(), prompt_len=len(p))
    rng = random.Random(1)
    partial = 0
    for r in range(14):
        # every third round proposes the model's own next tokens, so long accepts happen too
        if r % 3 == 2:
            probe = SequenceCache(lm.model)
            probe.prefill(history[:-1])
            draft, last = [], history[-1]
            for _ in range(rng.randint(1, 6)):
                last = mx.argmax(probe.feed([last])[-1]).item()
                draft.append(last)
        else:
            draft = [rng.randint(0, 255) for _ in range(rng.randint(1, 7))]
        v = verify_round(cache, history, draft, dec)
        partial += v.accepted < len(draft)
        for t in history[-1:] + v.tokens[:-1]:
            plain.feed([t])
        history += v.tokens
        cache.settle()
        plain.eval()
        assert cache.tokens == history[:-1]
        assert_same_state(cache, plain, exact=False)
    assert partial >= 5


@pytest.mark.parametrize("name", FAMILIES)
def test_rollback_is_bit_exact_against_the_same_blocks(family_models, name):
    """The rollback itself loses nothing and keeps nothing extra, bit for bit. Models that replay
    (state layers) must equal a cache that was fed only the kept tokens, in one block; models that
    trim or slice must equal the same verify block's rows cut at the kept length."""
    lm = family_models(name)
    rng = random.Random(5)
    dec = Decider(SamplingOptions(), prompt_len=1)
    rolled_back = 0
    for _trial in range(6):
        prompt = [rng.randint(0, 255) for _ in range(rng.randint(10, 20))]
        draft = [rng.randint(0, 255) for _ in range(rng.randint(1, 7))]
        x = SequenceCache(lm.model)
        x.prefill(prompt[:-1])
        v = verify_round(x, prompt, draft, dec)
        if name == "qwen3_5":  # Gated DeltaNet: per-step states picked, nothing left to replay
            assert x.fed == len(x.tokens)
        x.settle()
        rolled_back += v.accepted < len(draft)
        y = SequenceCache(lm.model)
        y.prefill(prompt[:-1])
        if "state" in describe_kinds(x.layers):
            y.feed([prompt[-1], *draft[: v.accepted]])
            # a picked state and its layers' rows come from the verify block, y's from a shorter one:
            # bit for bit only where a float32 matmul's rows do not depend on the block's height
            assert_same_state(x, y, exact=name != "qwen3_5" or rows_ignore_height(lm.model))
            continue
        y.feed([prompt[-1], *draft])
        cut = len(draft) - v.accepted
        for a, b in zip(x.layers, y.layers):
            if rollback_kind(b) == "trim":
                assert a.offset == b.offset - cut
                want = [b.keys[..., : a.offset, :], b.values[..., : a.offset, :]]
            else:
                assert a.offset == b.offset - cut
                n = min(a.offset, a.max_size)
                want = [b._temporal_order(t)[..., : t.shape[2] - cut, :][..., -n:, :] for t in (b.keys, b.values)]
            for got, w in zip(logical_rows(a)[:2], want):
                assert got.shape == w.shape and mx.array_equal(got, w).item()
    assert rolled_back >= 3


# ---- the full-model drafter: target, drafter or both without trimmable caches -------------------

PAIRS = [("qwen3_5", "llama"), ("llama", "qwen3_5"), ("qwen3_5", "qwen3_5"), ("gemma3_text", "recurrent_gemma")]


@pytest.fixture(scope="module")
def pair_models(family_models, tiny, tiny_draft):
    def get(target: str, drafter: str):
        t = tiny if target == "llama" else family_models(target)
        # the drafter: other weights (another seed), so it proposes wrong tokens too
        d = tiny_draft if drafter == "llama" else family_models(drafter, seed=7)
        return t, d

    return get


@pytest.fixture(scope="module")
def tiny_draft(tiny_draft_dir):
    return loading.load(loading.resolve(str(tiny_draft_dir)))


@pytest.mark.parametrize("target,drafter", PAIRS, ids=[f"{t}+{d}" for t, d in PAIRS])
def test_full_model_drafter_greedy_equals_plain(pair_models, target, drafter):
    t, d = pair_models(target, drafter)
    plain = engine_for(t)
    proposed = accepted = 0
    for block in (2, 4):
        spec = engine_for(t, full(block), draft_model=d.model)
        spec.warmup()
        for p in copy_prompts(4, seed=block):
            a, _ = run(plain, p, max_tokens=24, ignore_eos=True)
            b, g = run(spec, p, max_tokens=24, ignore_eos=True)
            assert a == b
            proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    assert proposed > accepted  # rejections (rollback of both caches) ran
    # the target drafting for itself accepts (almost) everything: the full-accept path
    self_spec = engine_for(t, full(4), draft_model=t.model)
    p = copy_prompts(1, seed=9)[0]
    b, g = run(self_spec, p, max_tokens=24, ignore_eos=True)
    assert b == run(plain, p, max_tokens=24, ignore_eos=True)[0]
    assert g.stats.accepted >= g.stats.proposed * 0.9 > 0


def test_lossless_pq_on_a_hybrid_pair_keeps_the_target_distribution(family_models):
    """Sampling with a hybrid drafter and a hybrid target: the (first, second) token pairs of the
    p/q rule follow plain sampling's distribution (two-sample chi-square)."""
    from collections import Counter

    from test_draft_model import ALPHA, chi2_sf

    t, d = family_models("qwen3_5"), family_models("qwen3_5", seed=0, scale=0.9)  # close, not equal
    s = SamplingOptions(temp=1.0, top_k=6)  # few enough (first, second) pairs to count
    prefix = copy_prompts(1, seed=4)[0][:12]
    spec, plain = engine_for(t, replace(full(2), acceptance="p-q"), draft_model=d.model), engine_for(t)
    n = 700
    got, want, rules, acc, prop = Counter(), Counter(), set(), 0, 0
    for seed in range(n):
        a, g = run(
            spec, prefix, max_tokens=2, sampling=SamplingOptions(**{**s.__dict__, "seed": seed}), ignore_eos=True
        )
        rules.add(g.stats.acceptance_rule)
        acc, prop = acc + g.stats.accepted, prop + g.stats.proposed
        got[tuple(a)] += 1
        want[
            tuple(
                run(
                    plain,
                    prefix,
                    max_tokens=2,
                    sampling=SamplingOptions(**{**s.__dict__, "seed": 10**6 + seed}),
                    ignore_eos=True,
                )[0]
            )
        ] += 1
    assert rules == {"lossless-p/q"}
    assert 0.05 < acc / prop < 0.95  # both branches of the rule ran
    keys = [k for k in set(got) | set(want) if got[k] + want[k] >= 10]
    rest = (n - sum(got[k] for k in keys), n - sum(want[k] for k in keys))
    table = [(got[k], want[k]) for k in keys] + ([rest] if sum(rest) >= 10 else [])
    assert len(table) >= 5
    stat = sum((a - b) ** 2 / (a + b) for a, b in table)
    assert chi2_sf(stat, len(table) - 1) > ALPHA


# ---- the commands on these families ---------------------------------------------------------------


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-families")
    return {n: tiny_models.build(root / n, tiny_models.FAMILIES[n]) for n in ("qwen3_5", "gemma3_text")}


def cli(args, env, input=None):
    import subprocess

    from conftest import mlxcel_cmd

    return subprocess.run(mlxcel_cmd() + args, capture_output=True, text=True, env=env, input=input, timeout=300)


@pytest.mark.parametrize("name", ["qwen3_5", "gemma3_text"])
def test_generate_chat_and_bench_on_hybrid_and_window_models(family_dirs, cli_env, tmp_path, name):
    m = ["-m", str(family_dirs[name])]
    base = ["generate", *m, "-p", "xyzxyzxyzxyz", "-n", "30", "--ignore-eos", "--no-chat-template"]
    plain, spec = cli(base, cli_env), cli(base + ["--prompt-lookup", "--profile"], cli_env)
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert plain.stdout == spec.stdout and "Traceback" not in spec.stderr
    assert "speculative=prompt-lookup" in spec.stderr
    chat = cli(["chat", *m, "-n", "8"], cli_env, input="hello\nagain\n")
    assert chat.returncode == 0 and "Traceback" not in chat.stderr, chat.stderr
    w = tmp_path / "w.jsonl"
    w.write_text('{"kind": "edit", "prompt": "abcabcabcabc"}\n')
    out = tmp_path / "b.json"
    bench = cli(["bench", *m, "--workload", str(w), "--max-tokens", "12", "--json", str(out)], cli_env)
    assert bench.returncode == 0, bench.stderr
    import json

    assert all(s["identical"] == s["prompts"] for s in json.loads(out.read_text())["summary"])

"""Speculative == plain, token for token, on tiny random models; rollback keeps caches exact."""

from __future__ import annotations

import random
from dataclasses import replace

import mlx.core as mx
import pytest
from conftest import verify_round

from mlxcel_py.drafters import registry
from mlxcel_py.engine.cache import SequenceCache
from mlxcel_py.engine.engine import Engine
from mlxcel_py.engine.sampling import Decider
from mlxcel_py.options import DraftConfig, LookupConfig, SamplingOptions

POLICIES = [("auto", True), ("graded", True), ("gated", True), ("cost", True), ("graded", False)]


def drafters_for(draft, model, *, eos_ids, vocab_size, assets=None):
    """The registry's DrafterSource for `draft` (None for plain decoding)."""
    if draft is None or not draft.enabled:
        return None
    return registry.kind_of(draft.kind).source(
        draft, model=model, eos_ids=eos_ids, vocab_size=vocab_size, assets=assets
    )


def engine_for(lm, draft=None, draft_model=None):
    return Engine(
        lm.model,
        eos_ids=lm.tokenizer.eos_token_ids,
        vocab_size=lm.vocab_size,
        context_length=lm.context_length,
        drafters=drafters_for(
            draft, lm.model, eos_ids=lm.tokenizer.eos_token_ids, vocab_size=lm.vocab_size, assets=draft_model
        ),
    )


def lookup(policy="auto", adaptive=True, max_draft=7, lo=2, hi=3):
    return DraftConfig(
        kind="prompt-lookup",
        lookup=LookupConfig(ngram_min=lo, ngram_max=hi, max_draft=max_draft, adaptive=adaptive, policy=policy),
    )


def prompts(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randint(0, 255) for _ in range(rng.randint(4, 24))]
        out.append(base + base[: rng.randint(2, len(base))] + [rng.randint(0, 255) for _ in range(3)] + base)
    return out


def run(eng, prompt, **kw):
    g = eng.generate(prompt, **kw)
    toks = [e.token for e in g]
    return toks, g


@pytest.mark.parametrize("policy,adaptive", POLICIES)
def test_greedy_prompt_lookup_equals_plain(tiny, policy, adaptive):
    plain = engine_for(tiny)
    spec = engine_for(tiny, lookup(policy, adaptive))
    spec.warmup(calibrate=policy == "cost")
    proposed = accepted = 0
    for p in prompts(12, seed=hash(policy) % 100):
        a, _ = run(plain, p, max_tokens=40)
        b, g = run(spec, p, max_tokens=40)
        assert a == b
        assert g.stats.generated_tokens == len(b)
        proposed += g.stats.proposed
        accepted += g.stats.accepted
    # both paths ran: some drafts accepted, some rejected
    assert accepted > 0
    assert proposed > accepted


def test_seeded_sampling_speculative_equals_plain(tiny):
    """Position-keyed draws: sampler-match reproduces the plain run exactly at any temperature."""
    plain = engine_for(tiny)
    spec = engine_for(tiny, lookup("graded", adaptive=False))
    for temp, top_p in [(0.7, 1.0), (1.0, 0.9), (1.5, 1.0)]:
        s = SamplingOptions(temp=temp, top_p=top_p, seed=123)
        for p in prompts(5, seed=7):
            a, _ = run(plain, p, max_tokens=30, sampling=s)
            b, g = run(spec, p, max_tokens=30, sampling=s)
            assert a == b
    c, _ = run(plain, prompts(1)[0], max_tokens=30, sampling=SamplingOptions(temp=1.0, seed=124))
    d, _ = run(plain, prompts(1)[0], max_tokens=30, sampling=SamplingOptions(temp=1.0, seed=123))
    assert c != d  # the seed matters


def test_repetition_penalty_applied_at_same_positions(tiny):
    s = SamplingOptions(repetition_penalty=1.3, repeat_last_n=16)
    plain = engine_for(tiny)
    spec = engine_for(tiny, lookup("graded", adaptive=False))
    for p in prompts(6, seed=3):
        assert run(plain, p, max_tokens=30, sampling=s)[0] == run(spec, p, max_tokens=30, sampling=s)[0]


def test_max_tokens_inside_block_and_zero(tiny):
    plain = engine_for(tiny)
    spec = engine_for(tiny, lookup("graded", adaptive=False))
    p = prompts(1, seed=5)[0]
    for n in (0, 1, 2, 5, 13):
        a, ga = run(plain, p, max_tokens=n)
        b, gb = run(spec, p, max_tokens=n)
        assert a == b and len(b) == n and gb.finish_reason == "length"
    _, g0 = run(spec, p, max_tokens=0)
    assert g0.stats.rounds == 0


def test_eos_inside_accepted_block_stops_where_plain_stops(tiny):
    """Make some token EOS; plain and speculative runs must end at the same place."""
    base = engine_for(tiny)
    p = prompts(1, seed=11)[0]
    toks, _ = run(base, p, max_tokens=40)
    eos = toks[len(toks) // 2]
    plain = Engine(tiny.model, eos_ids=[eos], vocab_size=tiny.vocab_size, context_length=2048)
    spec = Engine(
        tiny.model,
        eos_ids=[eos],
        vocab_size=tiny.vocab_size,
        context_length=2048,
        drafters=drafters_for(lookup("graded", adaptive=False), tiny.model, eos_ids=[eos], vocab_size=tiny.vocab_size),
    )
    a, ga = run(plain, p, max_tokens=40)
    b, gb = run(spec, p, max_tokens=40)
    assert a == b and ga.finish_reason == gb.finish_reason == "stop"
    assert eos not in b
    # --ignore-eos and --min-tokens mask EOS the same way in both
    a, _ = run(plain, p, max_tokens=40, ignore_eos=True)
    b, _ = run(spec, p, max_tokens=40, ignore_eos=True)
    assert a == b and len(a) == 40 and eos not in a


def test_verify_round_rollback_leaves_offsets_equal_to_committed(tiny):
    model = tiny.model
    p = prompts(1, seed=2)[0]
    cache = SequenceCache(model)
    cache.feed(p[:-1])
    history = list(p)
    dec = Decider(SamplingOptions(), prompt_len=len(p))
    rng = random.Random(0)
    for _ in range(20):
        draft = [rng.randint(0, 255) for _ in range(rng.randint(1, 7))]
        v = verify_round(cache, history, draft, dec)
        history += v.tokens
        # cache holds every committed token except the newest
        assert cache.layers[0].offset == len(history) - 1 == len(cache.tokens)
        assert cache.tokens == history[:-1]


def test_rollback_then_regenerate_matches_first_run(tiny):
    model = tiny.model
    p = prompts(1, seed=4)[0]
    cache = SequenceCache(model)
    cache.feed(p)
    first = cache.feed([1, 2, 3])
    cache.truncate(len(p))
    again = cache.feed([1, 2, 3])
    assert mx.allclose(first, again, atol=1e-5).item()


def test_recurrent_model_is_accepted_and_uncopyable_cache_refused():
    from mlx_lm.models.cache import ArraysCache

    from mlxcel_py.errors import ModelError
    from mlxcel_py.models import loading

    class Recurrent:
        layers = [0]

        def make_cache(self):
            return [ArraysCache(1)]

    loading.check_rollback(Recurrent())  # rolled back through a checkpoint now

    class Sealed:
        __slots__ = ("state",)

    class Opaque:
        layers = [0]

        def make_cache(self):
            return [Sealed()]

    with pytest.raises(
        ModelError, match="cannot speculate: its Sealed cache keeps its state where a checkpoint cannot copy it"
    ):
        loading.check_rollback(Opaque())


def test_prompt_cache_reuse_across_turns(tiny):
    eng = engine_for(tiny)
    p = prompts(1, seed=9)[0]
    first, _ = run(eng, p, max_tokens=10, reuse_cache=True)
    second_prompt = p + first + [5, 6, 7]
    b, g = run(eng, second_prompt, max_tokens=10, reuse_cache=True)
    assert g.stats.cached_tokens >= len(p) + len(first) - 1
    fresh, _ = run(engine_for(tiny), second_prompt, max_tokens=10)
    assert b == fresh


def test_logprobs_are_the_targets_own_with_and_without_speculation(tiny):
    """Each emitted token's logprob is the log-softmax of the target's logits at its position, the
    same (to float rounding) whether it came from a verify round or a plain step."""
    plain, spec = engine_for(tiny), engine_for(tiny, lookup("graded", adaptive=False))
    accepted = 0
    for p in prompts(6, seed=5):
        a, ga = run(plain, p, max_tokens=24, logprobs=3)
        b, gb = run(spec, p, max_tokens=24, logprobs=3)
        assert a == b
        accepted += gb.stats.accepted
        assert [x.token for x in ga.logprobs_out] == a == [x.token for x in gb.logprobs_out]
        for x, y in zip(ga.logprobs_out, gb.logprobs_out):
            assert abs(x.logprob - y.logprob) < 1e-4
            assert [t for t, _ in x.top] == [t for t, _ in y.top] and len(x.top) == 3
            assert x.top[0][0] == x.token and x.top[0][1] >= x.logprob - 1e-6  # greedy: the top token
        # against a direct forward of the sequence: the prompt but its last token in pieces of at
        # most 64 (as the engine prefills on the row-exact path: the CPU weights multiply blocks
        # of more than 65 rows in float32 and smaller ones with int8 activations), then the rest
        # as one block
        from mlx_lm.models.cache import make_prompt_cache

        from mlxcel_py.cpu import kernels as cpu_kernels

        with cpu_kernels.engaged(tiny.model):
            c = make_prompt_cache(tiny.model)
            chunk = cpu_kernels.prefill_chunk(tiny.model, 512)
            for i in range(0, len(p) - 1, chunk):
                mx.eval(tiny.model(mx.array([p[:-1][i : i + chunk]]), cache=c))
            rows = tiny.model(mx.array([p[-1:] + a[:-1]]), cache=c)[0]
        ref = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
        for i, x in enumerate(ga.logprobs_out):
            assert abs(ref[i, x.token].item() - x.logprob) < 1e-3
    assert accepted > 0  # some logprobs came from verify rounds


def test_a_cancelled_generation_stops_in_prefill_and_between_rounds(tiny):
    eng = engine_for(tiny)
    calls = []

    def cancelled():
        calls.append(1)
        return len(calls) > 3  # false for the prefill chunk and two rounds, then true

    toks, g = run(eng, prompts(1)[0], max_tokens=50, cancelled=cancelled)
    assert g.finish_reason == "cancelled" and len(toks) == 2
    toks, g = run(eng, list(range(1, 200)) * 6, max_tokens=5, cancelled=lambda: True)  # 1194 tokens: 3 chunks
    assert toks == [] and g.finish_reason == "cancelled" and g.stats.prefill_s == 0.0


@pytest.mark.parametrize("temp", [1e-300, 1e-30, 1e-6])
def test_tiny_temperatures_decode_greedily(temp):
    mx.random.seed(0)
    logits = mx.random.normal((4, 300)) * 5
    d = Decider(SamplingOptions(temp=temp, seed=1), prompt_len=0)
    assert d.greedy
    assert d.decide(logits, [], [0, 1, 2, 3]) == mx.argmax(logits, axis=-1).tolist()


@pytest.mark.parametrize("temp", [1e30, 1e308])
def test_huge_temperatures_are_uniform_over_the_filtered_set(temp):
    mx.random.seed(0)
    logits = mx.random.normal((1, 300)) * 5
    top5 = set(mx.argsort(-logits[0])[:5].tolist())
    d = Decider(SamplingOptions(temp=temp, top_k=5, top_p=1.0, min_p=0.0, seed=3), prompt_len=0)
    p = d.probs(logits)[0]
    assert not mx.isnan(p).any().item()
    assert sorted(i for i, v in enumerate(p.tolist()) if v > 0) == sorted(top5)
    assert mx.allclose(p[mx.array(sorted(top5))], mx.full((5,), 0.2)).item()
    picks = [d.decide(logits, list(range(i)), [0])[0] for i in range(60)]  # one draw per position
    assert set(picks) == top5


@pytest.mark.parametrize("top_p,min_p", [(1e-300, 0.0), (1.0, 1.0), (1.0, 1e-300), (1e-300, 1e-300)])
def test_extreme_filters_still_sample_a_real_token(top_p, min_p):
    mx.random.seed(0)
    logits = mx.random.normal((3, 300)) * 5
    d = Decider(SamplingOptions(temp=0.8, top_p=top_p, min_p=min_p, top_k=0, seed=4), prompt_len=0)
    assert not mx.isnan(d.probs(logits)).any().item()
    picks = d.decide(logits, [], [0, 1, 2])
    if top_p < 1e-6 or min_p == 1.0:  # only the top token survives the filter
        assert picks == mx.argmax(logits, axis=-1).tolist()
    assert all(0 <= t < 300 for t in picks)


def test_logit_bias_steers_plain_and_speculative_decoding_alike(tiny):
    """A bias is applied to every row at its position: speculative output equals plain output under
    the same bias (greedy and seeded sampling), a large one forces its token, false-like -inf bans."""
    plain = engine_for(tiny)
    spec = engine_for(tiny, lookup("cost"))
    p = prompts(1, seed=11)[0]
    free, _ = run(plain, p, max_tokens=24, ignore_eos=True)
    banned = free[0]
    for bias in (((banned, float("-inf")),), ((7, 2.5), (banned, -3.0))):
        for sampling in (SamplingOptions(logit_bias=bias), SamplingOptions(temp=0.8, seed=3, logit_bias=bias)):
            a, _ = run(plain, p, max_tokens=24, sampling=sampling, ignore_eos=True)
            b, g = run(spec, p, max_tokens=24, sampling=sampling, ignore_eos=True)
            assert a == b
            if bias[0][1] == float("-inf"):
                assert banned not in a
    forced, _ = run(spec, p, max_tokens=12, sampling=SamplingOptions(logit_bias=((42, 1e4),)), ignore_eos=True)
    assert forced == [42] * 12


def _toy_row(**fields) -> registry.DrafterKind:
    """The row of tests/toy_kinds/echo.py (a kind's whole registration)."""
    base = {
        "name": "toy",
        "module": "toy_kinds.echo",
        "sizing": registry.FIXED,
        "default_width": 3,
        "checkpoint": registry.NONE,
        "loads_weights": False,
        "help": "the newest token's last follower",
        "width_help": "toy default 3",
    }
    return registry.DrafterKind(**{**base, **fields})


def test_a_new_drafter_kind_is_one_module_and_its_row(tiny_dir, monkeypatch, cli_env):
    """tests/toy_kinds/echo.py and the row below are all a kind needs: the CLI takes it, its help
    lists it, and it drafts with the output unchanged."""
    from typer.testing import CliRunner

    import mlxcel_py as mc
    from mlxcel_py.cli import app

    monkeypatch.setitem(registry.KINDS, "toy", _toy_row())
    assert "toy (the newest token's last follower)" in registry.kind_help()
    prompt = "one two three one two three one two three one two"
    model = mc.load(str(tiny_dir), draft_kind="toy")
    ids = model.encode(prompt)
    gen = mc.speculative_generate(model, ids, mc.GenerateOptions(max_tokens=24, ignore_eos=True))
    toy = list(gen)
    plain = list(
        mc.speculative_generate(mc.load(str(tiny_dir)), ids, mc.GenerateOptions(max_tokens=24, ignore_eos=True))
    )
    st = gen.stats()
    assert toy == plain and st.draft_kind == "toy" and st.verifies > 0 and st.drafted > 0
    r = CliRunner().invoke(app, ["generate", "-m", str(tiny_dir), "-p", prompt, "-n", "8", "--draft-kind", "toy"])
    assert r.exit_code == 0, r.output


def test_a_new_kinds_checkpoint_folder_is_detected_by_its_row(tiny_dir, tmp_path, monkeypatch, cli_env):
    """A kind's row says which folders are its checkpoints (`detect`): such a folder given as a
    plain --draft-model runs as that kind, and is refused as -m or under another --draft-kind,
    with no code outside the row and the kind's module."""
    import json
    import shutil

    from typer.testing import CliRunner

    from mlxcel_py.cli import app

    row = _toy_row(
        checkpoint=registry.REQUIRED, detect=lambda cfg: "toy_drafter" in cfg, what="a toy drafter ({model_type})"
    )
    monkeypatch.setitem(registry.KINDS, "toy", row)
    folder = tmp_path / "toy"
    shutil.copytree(tiny_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "toy_drafter": {}}))
    prompt = "one two three one two three one two three one two"
    base = ["generate", "-m", str(tiny_dir), "-p", prompt, "-n", "12", "--ignore-eos", "--profile"]
    plain = CliRunner().invoke(app, base)
    ran = CliRunner().invoke(app, [*base, "--draft-model", str(folder)])
    assert plain.exit_code == 0 and ran.exit_code == 0, ran.output
    assert ran.stdout == plain.stdout and "toy" in ran.stderr
    refused = CliRunner().invoke(app, [*base, "--draft-model", str(folder), "--draft-kind", "full-model"])
    assert refused.exit_code == 1
    assert f"is a toy drafter ({cfg['model_type']}), not a standalone model; use --draft-kind toy" in refused.output
    as_model = CliRunner().invoke(app, ["generate", "-m", str(folder), "-p", prompt, "-n", "4"])
    assert as_model.exit_code == 1 and "pass its target model as -m" in as_model.output


def test_draft_min_drops_short_drafts_and_keeps_the_output(tiny):
    """llama-server's --draft-min (a request's speculative.n_min): a draft shorter than N is not
    verified, the round decodes plainly; the tokens are the same either way."""
    base = engine_for(tiny, lookup("graded", False))
    short = engine_for(tiny, replace(lookup("graded", False), min_draft=4))
    plain = engine_for(tiny)
    sizes, kept = [], []
    for p in prompts(8, seed=7):
        a, _ = run(plain, p, max_tokens=30)
        b, g = run(base, p, max_tokens=30)
        c, h = run(short, p, max_tokens=30)
        d, k = run(base, p, max_tokens=30, min_draft=64)  # the request's own, over the engine's
        assert a == b == c == d
        sizes.append((g.stats.drafted_rounds, g.stats.proposed))
        kept.append((h.stats.drafted_rounds, h.stats.proposed))
        assert k.stats.drafted_rounds == 0  # no draft is 64 long
    # drafts of 1..3 tokens were verified without the minimum and dropped with it
    assert sum(r for r, _ in kept) < sum(r for r, _ in sizes)
    assert all(n >= 4 * r for r, n in kept)

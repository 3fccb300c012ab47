"""Full-model drafter: greedy equivalence, full-accept and rejection paths, lossless sampling
(chi-square), and startup refusals that happen before the target's weights load."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import Counter
from dataclasses import replace

import mlx.core as mx
import pytest
from conftest import make_tiny_model
from test_engine import engine_for, prompts, run

from mlxcel_py.commands._options import build_options
from mlxcel_py.errors import ModelError
from mlxcel_py.formats.prompting import prompt_ids
from mlxcel_py.models import loading
from mlxcel_py.options import DraftConfig, SamplingOptions
from mlxcel_py.session import open_session
from mlxcel_py.validate import validate

ALPHA = 0.001  # significance level of the distribution tests
EOS = 258  # <|im_end|> in the tiny models' byte tokenizer


def full(block=4, path="draft"):
    return DraftConfig(kind="full-model", draft_model=path, block_size=block)


@pytest.fixture(scope="module")
def tiny_draft(tiny_draft_dir):
    return loading.load(loading.resolve(str(tiny_draft_dir)))


@pytest.fixture(scope="module")
def near_draft(tmp_path_factory):
    """The target's weights at a different scale: q is close to p but not equal, so both the
    accept and the residual branch of the p/q rule carry weight in the distribution tests."""
    d = make_tiny_model(tmp_path_factory.mktemp("near") / "model", seed=1, scale=2.0)
    return loading.load(loading.resolve(str(d)))


@pytest.mark.parametrize("block", [1, 2, 4, 7])
def test_greedy_tiny_pair_equals_plain(tiny, tiny_draft, block):
    plain = engine_for(tiny)
    spec = engine_for(tiny, full(block), draft_model=tiny_draft.model)
    for p in prompts(8, seed=block):
        a, _ = run(plain, p, max_tokens=30)
        b, g = run(spec, p, max_tokens=30)
        assert a == b
        assert g.stats.acceptance_rule == "greedy-argmax" and g.stats.drafted_rounds > 0


def test_target_drafting_for_itself_accepts_everything(tiny):
    spec = engine_for(tiny, full(4), draft_model=tiny.model)
    a, _ = run(engine_for(tiny), prompts(1)[0], max_tokens=40)
    b, g = run(spec, prompts(1)[0], max_tokens=40)
    assert a == b and g.stats.accepted == g.stats.proposed > 0


@pytest.mark.real
def test_default_model_self_draft_and_truncated_copy(real):
    ids = prompt_ids(real.tokenizer, "Explain why the sky is blue in two sentences.")
    plain, _ = run(engine_for(real), ids, max_tokens=40)
    same, g = run(engine_for(real, full(4), draft_model=real.model), ids, max_tokens=40)
    assert same == plain and g.stats.acceptance_rate > 0.95  # full-accept path
    cut = loading.load(real.resolved)
    cut.model.model.layers = cut.model.model.layers[:6]  # untrained truncated copy: rejection path
    low, g2 = run(engine_for(real, full(4), draft_model=cut.model), ids, max_tokens=40)
    assert low == plain and g2.stats.acceptance_rate < 0.5 and g2.stats.proposed > g2.stats.accepted


def chi2_sf(x: float, k: int) -> float:
    """Upper tail of chi-square with k dof (Wilson-Hilferty normal approximation)."""
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def chi2_gof(counts: Counter, probs: dict, n: int) -> float:
    bins, other_o, other_e = [], 0, 0.0
    for t, p in probs.items():
        if n * p >= 5:
            bins.append((counts.get(t, 0), n * p))
        else:
            other_o += counts.get(t, 0)
            other_e += n * p
    other_o += sum(c for t, c in counts.items() if t not in probs)
    if other_e >= 5:
        bins.append((other_o, other_e))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    return chi2_sf(stat, max(len(bins) - 1, 1))


def exact_first_token_probs(lm, prefix, s: SamplingOptions) -> dict:
    from mlxcel_py.engine.sampling import Decider

    logits = lm.model(mx.array([prefix]))[0, -1:]
    p = Decider(s, prompt_len=len(prefix)).probs(logits)[0].tolist()
    return {i: v for i, v in enumerate(p) if v > 0}


# temperature 1.0 alone is covered by t1.0-top_p0.9 (the same rule, plus a filter)
@pytest.mark.parametrize(
    "s",
    [SamplingOptions(temp=0.7), SamplingOptions(temp=1.0, top_p=0.9), SamplingOptions(temp=1.5, top_k=20)],
    ids=["t0.7", "t1.0-top_p0.9", "t1.5-top_k20"],
)
def test_lossless_pq_matches_target_distribution(tiny, near_draft, s):
    """First and second tokens under p/q acceptance follow the target's own sampling distribution."""
    prefix = prompts(1, seed=21)[0][:12]
    spec = engine_for(tiny, replace(full(2), acceptance="p-q"), draft_model=near_draft.model)
    plain = engine_for(tiny)
    n = 1500
    firsts, pairs_spec, pairs_plain, rules = Counter(), Counter(), Counter(), set()
    for seed in range(n):
        t, g = run(spec, prefix, max_tokens=2, sampling=SamplingOptions(**{**s.__dict__, "seed": seed}))
        rules.add(g.stats.acceptance_rule)
        firsts[t[0] if t else EOS] += 1  # an empty output means the first token was EOS
        pairs_spec[tuple(t)] += 1
        u, _ = run(plain, prefix, max_tokens=2, sampling=SamplingOptions(**{**s.__dict__, "seed": 10**6 + seed}))
        pairs_plain[tuple(u)] += 1
    assert rules == {"lossless-p/q"}
    assert 0.1 < spec_accept_rate(spec, prefix, s) < 0.95  # both branches of the rule ran
    assert chi2_gof(firsts, exact_first_token_probs(tiny, prefix, s), n) > ALPHA
    # two-sample test on the joint (first, second) distribution against plain sampling
    keys = [k for k in set(pairs_spec) | set(pairs_plain) if pairs_spec[k] + pairs_plain[k] >= 10]
    rest_s = n - sum(pairs_spec[k] for k in keys)
    rest_p = n - sum(pairs_plain[k] for k in keys)
    table = [(pairs_spec[k], pairs_plain[k]) for k in keys] + ([(rest_s, rest_p)] if rest_s + rest_p >= 10 else [])
    stat = sum((a - b) ** 2 / (a + b) for a, b in table)
    assert chi2_sf(stat, max(len(table) - 1, 1)) > ALPHA


def test_sampler_match_drafts_reproduce_plain_sampling_token_for_token(tiny, near_draft):
    """--draft-acceptance sampler-match (the default): a model drafter draws with the target's own
    key at each position, so a seeded sampled reply equals plain decoding's token for token;
    drafting with the target itself, every draft stands (with a key of its own a draw would agree
    only by chance). Gumbel-max coupling accepts somewhat less than p/q on a pair this far apart
    (0.32 against 0.44 at temperature 1, top-p 0.9), hence the loose bound."""
    prefix = prompts(1, seed=21)[0][:12]
    plain = engine_for(tiny)
    coupled = engine_for(tiny, full(3), draft_model=near_draft.model)
    pq = engine_for(tiny, replace(full(3), acceptance="p-q"), draft_model=near_draft.model)
    itself = engine_for(tiny, full(3), draft_model=tiny.model)
    for temp, extra in ((0.7, {}), (1.0, {"top_p": 0.9}), (1.5, {"top_k": 20})):
        s = SamplingOptions(temp=temp, **extra)
        for seed in range(12):
            sampling = SamplingOptions(**{**s.__dict__, "seed": seed})
            want, _ = run(plain, prefix, max_tokens=16, sampling=sampling, ignore_eos=True)
            got, g = run(coupled, prefix, max_tokens=16, sampling=sampling, ignore_eos=True)
            assert got == want and g.stats.acceptance_rule == "sampler-match" and g.stats.proposed > 0
            same, g = run(itself, prefix, max_tokens=16, sampling=sampling, ignore_eos=True)
            assert same == want and g.stats.accepted == g.stats.proposed > 0
        rate, pq_rate = spec_accept_rate(coupled, prefix, s), spec_accept_rate(pq, prefix, s)
        assert 0.0 < rate < 1.0 and rate > 0.6 * pq_rate, (temp, rate, pq_rate)


def spec_accept_rate(eng, prefix, s) -> float:
    acc = prop = 0
    for seed in range(50):
        _, g = run(eng, prefix, max_tokens=8, sampling=SamplingOptions(**{**s.__dict__, "seed": seed}))
        acc, prop = acc + g.stats.accepted, prop + g.stats.proposed
    return acc / prop


def test_sampler_match_distribution_for_one_hot_drafts(tiny):
    """Prompt lookup (one-hot drafts, sampler-match) keeps the first-token distribution too."""
    from test_engine import lookup

    s = SamplingOptions(temp=1.0)
    prefix = prompts(1, seed=22)[0][:12]
    spec = engine_for(tiny, lookup("graded", adaptive=False))
    n = 1500
    outs = (run(spec, prefix, max_tokens=1, sampling=SamplingOptions(temp=1.0, seed=i))[0] for i in range(n))
    firsts = Counter(o[0] if o else EOS for o in outs)
    assert chi2_gof(firsts, exact_first_token_probs(tiny, prefix, s), n) > ALPHA


# ---- refusals, before the target's weights load --------------------------------------------


def session_for(target, draft):
    return open_session(
        validate(build_options("generate", {"prompt": "x", "model": str(target), "draft_model": str(draft)}))
    )


def copy_model(src, dst, edit=None):
    shutil.copytree(src, dst)
    if edit:
        cfg = json.loads((dst / "config.json").read_text())
        edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_refuses_larger_drafter_vocab(tiny_dir, tiny_draft_dir, tmp_path, no_weights):
    d = copy_model(tiny_draft_dir, tmp_path / "d", lambda c: c.update(vocab_size=999))
    with pytest.raises(ModelError, match=r"vocabulary \(999\) is larger than the target's \(260\)"):
        session_for(tiny_dir, d)


def test_refuses_config_without_vocab_size(tiny_dir, tiny_draft_dir, tmp_path, no_weights):
    d = copy_model(tiny_draft_dir, tmp_path / "d", lambda c: c.pop("vocab_size"))
    with pytest.raises(ModelError, match="declares no vocab_size"):
        session_for(tiny_dir, d)
    t = copy_model(tiny_dir, tmp_path / "t", lambda c: c.pop("vocab_size"))
    with pytest.raises(ModelError, match="target model's config.json declares no vocab_size"):
        session_for(t, tiny_draft_dir)


def test_refuses_tokenizers_whose_ids_disagree(tiny_dir, tiny_draft_dir, tmp_path, no_weights):
    d = copy_model(tiny_draft_dir, tmp_path / "d")
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    (d / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ModelError, match="maps 2 token\\(s\\) to different ids"):
        session_for(tiny_dir, d)


def test_a_dflash_folder_is_not_run_as_a_full_model(tiny_dir, tiny_draft_dir, tmp_path, no_weights):
    """Detected structurally: without --draft-kind it is taken as a DFlash drafter (and this one,
    a causal LM under DFlash's name, is refused as one); with --draft-kind full-model it is refused."""
    d = copy_model(tiny_draft_dir, tmp_path / "d", lambda c: c.update(architectures=["DFlashDraftModel"]))
    with pytest.raises(ModelError, match="declares no dflash_config.mask_token_id"):
        session_for(tiny_dir, d)
    opts = {"prompt": "x", "model": str(tiny_dir), "draft_model": str(d), "draft_kind": "full-model"}
    with pytest.raises(ModelError, match="is a DFlash speculative drafter, not a standalone model; use --draft-kind"):
        open_session(validate(build_options("generate", opts)))


def test_refuses_a_dflash_folder_as_the_model(tiny_dir, tmp_path, no_weights):
    d = copy_model(tiny_dir, tmp_path / "dflash", lambda c: c.update(architectures=["DFlashDraftModel"]))
    with pytest.raises(ModelError, match="is a DFlash speculative drafter, not a standalone model; pass its target"):
        open_session(validate(build_options("generate", {"prompt": "x", "model": str(d)})))


def test_refuses_missing_or_malformed_drafter_config(tiny_dir, tmp_path, no_weights):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        session_for(tiny_dir, tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{oops")
    with pytest.raises(ModelError, match="malformed JSON"):
        session_for(tiny_dir, tmp_path / "bad")


def test_refuses_a_drafter_whose_caches_cannot_be_rolled_back(tiny_dir, tiny_draft_dir, monkeypatch, no_weights):
    """Recurrent and window caches roll back through checkpoints now; the one refusal left is a
    cache object a checkpoint cannot copy, and it comes before any weight loads."""
    import mlx_lm.models.cache as mlx_cache

    class Sealed:
        __slots__ = ("state",)

    monkeypatch.setattr(mlx_cache, "make_prompt_cache", lambda model: [Sealed()])
    with pytest.raises(ModelError, match="the draft model cannot speculate: its Sealed cache keeps its state"):
        session_for(tiny_dir, tiny_draft_dir)


def test_first_divergence_reports_index_and_margins(tiny):
    from mlxcel_py.engine.exactness import first_divergence

    p = prompts(1, seed=30)[0]
    plain, _ = run(engine_for(tiny), p, max_tokens=12)
    assert first_divergence(tiny.model, p, plain, plain) is None
    other = plain[:5] + [(plain[5] + 1) % 256] + plain[6:]
    d = first_divergence(tiny.model, p, other, plain)
    assert d.index == 5 and d.plain_token == plain[5] and d.speculative_token == other[5]
    assert d.step_margin > 0  # plain greedy picked its token, so its logit is higher
    assert "first difference at generated token 5" in d.describe(tiny.tokenizer)


def test_cli_verify_exact_with_draft_model(tiny_dir, tiny_draft_dir, cli_env):
    import subprocess

    from conftest import mlxcel_cmd

    r = subprocess.run(
        mlxcel_cmd()
        + [
            "generate",
            "-m",
            str(tiny_dir),
            "--draft-model",
            str(tiny_draft_dir),
            "-p",
            "hello",
            "-n",
            "20",
            "--verify-exact",
            "--profile",
        ],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "[verify-exact] speculative output equals plain output (20 tokens)" in r.stderr
    assert re.search(r"^\[Speculative acceptance\] rule=greedy-argmax rounds=\d+ .* kind=full-model$", r.stderr, re.M)


def test_chat_speculates_with_a_draft_model(tiny_dir, tiny_draft_dir, cli_env):
    import subprocess

    from conftest import mlxcel_cmd

    base = mlxcel_cmd() + ["chat", "-m", str(tiny_dir), "-n", "12", "--profile"]
    spec = subprocess.run(
        base + ["--draft-model", str(tiny_draft_dir)],
        input="hi\nagain\n",
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    plain = subprocess.run(base, input="hi\nagain\n", capture_output=True, text=True, env=cli_env, timeout=300)
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr + plain.stderr
    assert spec.stdout == plain.stdout and spec.stdout.strip()
    rounds = [int(m) for m in re.findall(r"full-model: (\d+) drafted rounds", spec.stderr)]
    assert len(rounds) == 2 and sum(rounds) > 0  # both turns ran verify rounds
    assert "drafted rounds" not in plain.stderr

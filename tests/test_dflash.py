"""The DFlash drafter (`--draft-kind dflash`, or a DFlash folder as --draft-model).

Checkpoints are written in z-lab's layout (config.json with dflash_config, safetensors without an
embedding or lm_head). Random weights prove exactness and rollback on a plain Qwen3 target (fused
layers and mlx-lm's own) and on a hybrid Qwen3.5 target; a drafter whose mask rows predict the
mask token shows accepted drafts on the hybrid's repeating output; a tiny target trained for
seconds on a synthetic pattern, with a DFlash drafter trained all at once on its tapped hidden
states (dflash_net.train_logits), proves the forward: the incremental drafter reproduces the
all-at-once logits and its drafts are accepted, fully and partially. Then every refusal, before
any weight loads, and the CLI, server and bench faces.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest
import tiny_models
from conftest import mlxcel_cmd, write_byte_tokenizer
from mlx.utils import tree_flatten
from test_engine import run
from test_families import copy_prompts

from mlxcel_py.commands._options import build_options
from mlxcel_py.drafters import dflash, registry
from mlxcel_py.drafters.dflash_net import DFlashNet
from mlxcel_py.engine.engine import Engine
from mlxcel_py.engine.policy import FixedPolicy
from mlxcel_py.engine.sampling import Decider
from mlxcel_py.errors import ModelError, UsageError
from mlxcel_py.models import decoder_layers
from mlxcel_py.models.taps import layer_tap, lm_head_and_embed
from mlxcel_py.options import SamplingOptions
from mlxcel_py.session import open_session
from mlxcel_py.validate import validate

QWEN3, QWEN35 = tiny_models.QWEN3, tiny_models.QWEN35


def session(target, draft_model=None, **params):
    opts = {"prompt": "x", "model": str(target), **params}
    if draft_model is not None:
        opts["draft_model"] = str(draft_model)
    return open_session(validate(build_options("generate", opts)))


def plain_engine(s):
    return Engine(s.engine.model, eos_ids=s.engine.eos_ids, vocab_size=s.target.vocab_size, context_length=2048)


def self_mask_checkpoint(folder: Path, target_cfg: dict, mask: int, **cfg) -> Path:
    """A drafter whose layers add nothing (o_proj, down_proj zero): each mask row's output is the
    normed mask embedding, so through a tied lm_head every draft is the mask token itself."""
    config = tiny_models.dflash_config(target_cfg, mask=mask, **cfg)
    mx.random.seed(4)
    net = DFlashNet(dflash.read_spec(config, folder, config["num_target_layers"]))
    params = {
        k: (mx.zeros_like(v) if k.endswith(("o_proj.weight", "down_proj.weight")) else v)
        for k, v in tree_flatten(net.parameters())
    }
    return tiny_models.dflash_checkpoint(folder, config, params=params)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash")
    qwen3 = tiny_models.build(root / "qwen3", QWEN3, seed=1, scale=0.5)
    hybrid = tiny_models.build(root / "hybrid", QWEN35, scale=0.2)  # settles into repeating one token
    return {
        "qwen3": qwen3,
        "hybrid": hybrid,
        "draft": tiny_models.dflash_checkpoint(root / "draft", tiny_models.dflash_config(QWEN3, layers=2)),
        # Qwen3.5 checkpoints keep block_size inside dflash_config
        "hybrid_draft": tiny_models.dflash_checkpoint(
            root / "hybrid_draft", tiny_models.dflash_config(QWEN35, layers=2, block=5, nested=True)
        ),
        "windowed": tiny_models.dflash_checkpoint(
            root / "windowed",
            tiny_models.dflash_config(
                QWEN3, layers=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
            ),
        ),
    }


def equal_to_plain(s, prompts, max_tokens, *, sampled=True, kind="dflash") -> tuple[int, int]:
    """Greedy and seeded sampled output equal plain decoding's (sampled: the default sampler-match)."""
    plain = plain_engine(s)
    proposed = accepted = 0
    for i, p in enumerate(prompts):
        for sampling in (SamplingOptions(), SamplingOptions(temp=0.8, seed=i))[: 2 if sampled else 1]:
            a, _ = run(plain, p, max_tokens=max_tokens, sampling=sampling, ignore_eos=True)
            b, g = run(s.engine, p, max_tokens=max_tokens, sampling=sampling, ignore_eos=True)
            assert a == b, i  # sampled too: drafts drawn with the target's keys (sampler-match)
            if not sampling.greedy:
                assert g.stats.acceptance_rule == "sampler-match" and len(b) == max_tokens
            assert g.stats.draft_kind == kind and g.stats.drafted_rounds > 0
            proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    return proposed, accepted


class RoundLog(FixedPolicy):
    """The fixed policy, recording every verify round as (drafted, accepted) in `log`."""

    def __init__(self, width: int, log: list):
        super().__init__(width)
        self.log = log

    def drafted(self, n, accepted):
        self.log.append((n, accepted))
        return super().drafted(n, accepted)


def pattern_rounds(s, rng, prompts: int) -> tuple[int, int, list]:
    """Greedy speculative output equals plain on `prompts` synthetic-pattern prompts; returns
    (proposed, accepted, every round's (drafted, accepted))."""
    plain = plain_engine(s)
    rounds: list = []
    proposed = accepted = 0
    for _ in range(prompts):
        p = tiny_models.pattern(rng, 12)
        a, _ = run(plain, p, max_tokens=40, ignore_eos=True)
        b, g = run(s.engine, p, max_tokens=40, ignore_eos=True, policy=RoundLog(s.drafters.width, rounds))
        assert a == b
        proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    return proposed, accepted, rounds


# ---- exactness and rollback ----------------------------------------------------------------------


def test_auto_detected_with_the_checkpoints_width_and_equal_to_plain(dirs):
    s = session(dirs["qwen3"], draft_model=dirs["draft"])  # no --draft-kind: the folder says dflash
    d = s.engine.draft
    assert (d.kind, d.block_size, d.block_explicit) == ("dflash", 8, False)
    assert s.drafters.width == 7  # the block's first row is the last committed token
    assert decoder_layers.fused(s.engine.model)  # the taps record inside the fused layers' loop
    s.engine.warmup()
    equal_to_plain(s, copy_prompts(4, seed=1), 30)


def test_equal_to_plain_on_mlx_lm_layers_and_sliding_window_drafter_layers(dirs):
    s = session(dirs["qwen3"], draft_model=dirs["windowed"], draft_kind="dflash")
    with decoder_layers.unfused(s.engine.model):  # taps through the recording layer classes
        equal_to_plain(s, copy_prompts(3, seed=2), 30)


def test_taps_leave_the_targets_logits_bit_identical(dirs):
    s = session(dirs["qwen3"])
    model = s.engine.model
    x = mx.array([[5, 9, 30, 2, 7, 7, 100]])
    before = model(x)
    tap = layer_tap(model, (1, 2))
    after = model(x)
    assert mx.array_equal(before, after).item()
    assert tap.last.shape == (1, 7, 2 * QWEN3["hidden_size"])


def test_hybrid_target_exact_with_accepted_and_rejected_drafts(dirs):
    """Qwen3.5 (Gated DeltaNet + attention): a rejected draft rolls the recurrent state back.
    The drafter drafts the token the target settles into, so rounds are accepted once it repeats."""
    plain = session(dirs["hybrid"])
    p = copy_prompts(1, seed=3)[0]
    out, _ = run(plain.engine, p, max_tokens=40, ignore_eos=True)
    settled = Counter(out[-10:]).most_common(1)[0][0]
    draft = self_mask_checkpoint(dirs["hybrid"].parent / "self_mask", QWEN35, settled, layers=1, block=4)
    s = session(dirs["hybrid"], draft_model=draft)
    assert s.engine.draft.kind == "dflash" and s.drafters.width == 3
    proposed, accepted = equal_to_plain(s, copy_prompts(4, seed=3), 40)
    assert 0 < accepted < proposed
    r = session(dirs["hybrid"], draft_model=dirs["hybrid_draft"])
    assert r.engine.draft.block_size == 5  # read from dflash_config
    equal_to_plain(r, copy_prompts(2, seed=4), 24)


def test_lossless_pq_keeps_the_target_distribution(dirs):
    from test_draft_model import ALPHA, chi2_sf

    plain = session(dirs["hybrid"])
    start = copy_prompts(1, seed=8)[0][:10]
    prefix = start + run(plain.engine, start, max_tokens=20, ignore_eos=True)[0]
    settled = Counter(prefix[-8:]).most_common(1)[0][0]
    draft = self_mask_checkpoint(dirs["hybrid"].parent / "pq", QWEN35, settled, layers=1, block=3)
    s = session(dirs["hybrid"], draft_model=draft, draft_acceptance="p-q")
    samp = dict(temp=1.0, top_k=5)
    n = 500
    got, want, acc, prop = Counter(), Counter(), 0, 0
    for seed in range(n):
        a, g = run(s.engine, prefix, max_tokens=2, sampling=SamplingOptions(**samp, seed=seed), ignore_eos=True)
        acc, prop = acc + g.stats.accepted, prop + g.stats.proposed
        got[tuple(a)] += 1
        b, _ = run(plain.engine, prefix, max_tokens=2, sampling=SamplingOptions(**samp, seed=10**6 + seed))
        want[tuple(b)] += 1
    assert 0 < acc < prop
    keys = [k for k in set(got) | set(want) if got[k] + want[k] >= 10]
    rest = (n - sum(got[k] for k in keys), n - sum(want[k] for k in keys))
    table = [(got[k], want[k]) for k in keys] + ([rest] if sum(rest) >= 10 else [])
    assert len(table) >= 3
    assert chi2_sf(sum((a - b) ** 2 / (a + b) for a, b in table), len(table) - 1) > ALPHA


def test_a_round_near_max_tokens_is_narrower(dirs):
    s = session(dirs["qwen3"], draft_model=dirs["draft"])
    log: list = []
    toks, g = run(
        s.engine, copy_prompts(1, seed=5)[0], max_tokens=4, ignore_eos=True, policy=RoundLog(s.drafters.width, log)
    )
    sizes = [n for n, _ in log]
    assert len(toks) == 4 and sizes and max(sizes) <= 3  # never past max_tokens (- the bonus token)


def test_context_cache_is_reused_across_a_chats_turns(dirs):
    s = session(dirs["qwen3"], draft_model=dirs["draft"])
    eng = s.engine
    p = copy_prompts(1, seed=6)[0]
    first, _ = run(eng, p, max_tokens=12, ignore_eos=True, reuse_cache=True)
    drafter = eng.make_drafter()
    held = len(drafter.ids)
    assert held > len(p) - 1 and drafter.base == 0
    turn2 = p + first + [1, 2, 3]
    second, g = run(eng, turn2, max_tokens=12, ignore_eos=True, reuse_cache=True)
    assert g.stats.cached_tokens > 0
    assert second == run(plain_engine(s), turn2, max_tokens=12, ignore_eos=True)[0]
    assert drafter.base == 0  # the common prefix's context rows were kept, not rebuilt


# ---- the forward, proven on a trained pair -------------------------------------------------------

LO, M = tiny_models.PATTERN_LO, tiny_models.PATTERN_M  # mask token LO+M
pattern = tiny_models.pattern


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from mlx_lm.models import qwen3
    from mlx_lm.utils import save_config, save_model

    root = tmp_path_factory.mktemp("trained")
    rng = random.Random(0)
    cfg = dict(QWEN3, num_hidden_layers=2)
    mx.random.seed(0)
    target = qwen3.Model(qwen3.ModelArgs.from_dict(cfg))
    # it learns the rule (the first two tokens of a row are random, so the loss stays above 0)
    assert tiny_models.train_target(target, rng, steps=300, lr=3e-3) < 0.5

    B = 6
    dcfg = tiny_models.dflash_config(cfg, layers=1, ids=[0, 1], block=B, mask=LO + M)
    net = DFlashNet(dflash.read_spec(dcfg, root, 2))
    tap = layer_tap(target, (0, 1))
    lm_head, embed = lm_head_and_embed(target)
    target.freeze()
    opt = optim.AdamW(3e-3)

    def draft_loss(net, features, x, anchors):
        blocks = mx.stack([mx.concatenate([x[a : a + 1], mx.full((B - 1,), LO + M)]) for a in anchors])
        logits = net.train_logits(features, embed(blocks), mx.array(anchors), lm_head)
        return nn.losses.cross_entropy(logits[:, 1:], mx.stack([x[a + 1 : a + B] for a in anchors])).mean()

    dstep = nn.value_and_grad(net, draft_loss)
    for _ in range(400):
        x = mx.array(pattern(rng, 40))
        target(x[None])
        anchors = [rng.randrange(1, 40 - B) for _ in range(8)]
        loss, grads = dstep(net, mx.stop_gradient(tap.last), x, anchors)
        opt.update(net, grads)
        mx.eval(net.parameters(), opt.state)
    target.unfreeze()
    folder = root / "target"
    folder.mkdir()
    save_model(folder, target)
    save_config(dict(cfg), folder / "config.json")
    write_byte_tokenizer(folder)
    draft = tiny_models.dflash_checkpoint(root / "draft", dcfg, params=dict(tree_flatten(net.parameters())))
    return folder, draft, net, rng


def test_trained_drafter_incremental_forward_equals_its_training_form(trained):
    """The drafter run from its cache, round by round, gives the logits of the all-at-once
    forward it was trained with (same weights, same target features)."""
    folder, draft, _, rng = trained
    s = session(folder, draft_model=draft)
    eng = s.engine
    drafter = eng.make_drafter()
    x = pattern(rng, 30)
    from mlxcel_py.engine.cache import SequenceCache

    cache = SequenceCache(eng.model)
    cache.keep_hidden(drafter.hidden_tap)
    decider = Decider(SamplingOptions(temp=1.0), prompt_len=10, vocab_size=eng.vocab_size, pq_drafts=True)
    got = []
    cache.prefill(x[:9])
    drafter.begin(x[:10], cache)
    for L in (10, 13, 14, 20):  # rounds after 3, 1 and 6 committed tokens
        cache.prefill(x[len(cache.tokens) : L - 1])
        got.append(drafter.propose(x[:L], 5, decider).q)
    net = s.drafters.net
    lm_head, embed = lm_head_and_embed(eng.model)
    eng.model(mx.array([x[:19]]))
    features = drafter.hidden_tap.last
    anchors = [9, 12, 13, 19]
    blocks = mx.array([[x[a]] + [LO + M] * 5 for a in anchors])
    want = mx.softmax(net.train_logits(features, embed(blocks), mx.array(anchors), lm_head)[:, 1:], axis=-1)
    for g, w in zip(got, want):
        assert mx.allclose(g[:, : w.shape[-1]], w.astype(mx.float32), atol=2e-4).item()


def test_trained_drafter_drafts_are_accepted_fully_and_partially(trained):
    folder, draft, _, rng = trained
    s = session(folder, draft_model=draft)
    proposed, accepted, rounds = pattern_rounds(s, rng, 4)
    assert accepted > 0.5 * proposed  # random weights accept next to nothing
    assert any(n == a for n, a in rounds) and any(0 < a < n for n, a in rounds)


def tree_gain(s, seed: int, prompts: int = 6) -> tuple[float, int]:
    """Greedy output equals plain on synthetic-pattern prompts; (tokens a verify round yields,
    rounds whose accepted path left the tree's first chain)."""
    plain, rng = plain_engine(s), random.Random(seed)
    rounds = tokens = branches = 0
    for _ in range(prompts):
        p = tiny_models.pattern(rng, 12)
        a, _ = run(plain, p, max_tokens=40, ignore_eos=True)
        b, g = run(s.engine, p, max_tokens=40, ignore_eos=True)
        assert a == b
        rounds, tokens = rounds + g.stats.drafted_rounds, tokens + g.stats.accepted + g.stats.drafted_rounds
        branches += g.stats.branch_accepts
    return tokens / rounds, branches


def test_trained_drafter_trees_equal_plain_and_yield_no_less_per_round(trained):
    """Best-first trees through the trained block's positions (DDTree): output still equals
    plain, and a round yields at least a chain's tokens (the tree holds the chain). This drafter
    misses rarely (5.6 of 6 tokens a round here), so few rounds can take a branch: the EAGLE-3
    pair's runner-ups show branches taken."""
    folder, draft, _, _ = trained
    chain, _ = tree_gain(session(folder, draft_model=draft), seed=11)
    tree, branches = tree_gain(session(folder, draft_model=draft, draft_tree_budget=6), seed=11)
    assert tree >= chain, (chain, tree, branches)


# ---- refusals: each before any target weight loads ----------------------------------------------


def edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c.update(hidden_size=32), r"the drafter's hidden_size \(32\) is not the target's \(64\)"),
        (lambda c: c.update(vocab_size=300), r"the drafter's vocab_size \(300\) is not the target's \(260\)"),
        (lambda c: c["dflash_config"].update(target_layer_ids=[1, 4]), r"names layer 4, outside the target's 4"),
        (lambda c: c.update(num_target_layers=36), r"trained on a 36-layer target \(num_target_layers\)"),
        (lambda c: c["dflash_config"].update(mask_token_id=999), r"mask_token_id 999 is outside the vocabulary"),
        (lambda c: c.update(architectures=["DFlash2DraftModel"]), r"architecture DFlash2DraftModel; DFlash2"),
        (lambda c: c.update(architectures=["EagleDraftModel"]), r"architecture EagleDraftModel; mlxcel-py runs"),
        (lambda c: c.update(intermediate_size=64), r"tensor layers.0.mlp.gate_proj.weight has shape \[128, 64\]"),
        (lambda c: c["dflash_config"].pop("mask_token_id"), r"declares no dflash_config.mask_token_id"),
    ],
)
def test_refuses_a_drafter_that_does_not_fit(dirs, tmp_path, no_weights, edit, message):
    d = edited(dirs["draft"], tmp_path / "d", edit)
    with pytest.raises(ModelError, match=message):
        session(dirs["qwen3"], draft_model=d)


def test_refuses_a_missing_tensor(dirs, tmp_path, no_weights):
    d = tmp_path / "d"
    shutil.copytree(dirs["draft"], d)
    tensors = mx.load(str(d / "model.safetensors"))
    del tensors["layers.1.self_attn.k_norm.weight"]
    mx.save_safetensors(str(d / "model.safetensors"), tensors)
    with pytest.raises(ModelError, match=r"tensor layers.1.self_attn.k_norm.weight is missing"):
        session(dirs["qwen3"], draft_model=d)


def test_refuses_dflash_as_the_model_and_as_a_full_model(dirs, no_weights):
    with pytest.raises(ModelError, match="is a DFlash speculative drafter, not a standalone model; pass its target"):
        session(dirs["draft"])
    with pytest.raises(ModelError, match="is a DFlash speculative drafter.*use --draft-kind dflash"):
        session(dirs["qwen3"], draft_model=dirs["draft"], draft_kind="full-model")
    with pytest.raises(ModelError, match="is not a DFlash drafter .*drop --draft-kind dflash"):
        session(dirs["qwen3"], draft_model=dirs["qwen3"], draft_kind="dflash")


def test_refuses_a_block_that_drafts_nothing(dirs, no_weights):
    with pytest.raises(UsageError, match="--draft-block-size 1: a dflash block's first row"):
        session(dirs["qwen3"], draft_model=dirs["draft"], draft_kind="dflash", draft_block_size=1)
    with pytest.raises(ModelError, match="a DFlash block of 1 drafts nothing"):
        session(dirs["qwen3"], draft_model=dirs["draft"], draft_block_size=1)  # detected from the folder


def test_width_precedence(dirs, tmp_path):
    assert session(dirs["qwen3"], draft_model=dirs["draft"], draft_block_size=4).engine.draft.block_size == 4
    undeclared = edited(dirs["draft"], tmp_path / "u", lambda c: c.pop("block_size"))
    assert session(dirs["qwen3"], draft_model=undeclared).engine.draft.block_size == 16  # the seed's default
    assert registry.label(session(dirs["qwen3"], draft_model=dirs["draft"]).engine.draft) == "dflash k=7"


# ---- the faces -----------------------------------------------------------------------------------


def test_cli_generate_dflash_profile_and_startup_lines(dirs, cli_env):
    args = ["generate", "-m", str(dirs["qwen3"]), "-p", "abcabcabc", "-n", "24", "--ignore-eos", "--no-chat-template"]
    plain = subprocess.run(mlxcel_cmd() + args, capture_output=True, text=True, env=cli_env, timeout=300)
    spec = subprocess.run(
        mlxcel_cmd() + args + ["--draft-model", str(dirs["draft"]), "--profile"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    assert f"speculative=dflash (draft_model={dirs['draft']}, block_size=8, default)" in spec.stderr
    assert "Resolved drafter kind: dflash (block_size = 8, default)" in spec.stderr
    assert re.search(r"^\[Speculative acceptance\] rule=greedy-argmax rounds=\d+ .* kind=dflash$", spec.stderr, re.M)
    assert "Traceback" not in spec.stderr


def test_serve_dflash_timings_and_batched_sequences_exact(dirs, cli_env):
    """-np 2 batches the two sequences' forwards (each keeps its own tapped rows); both equal the
    plain CLI's output and timings name the kind."""
    from concurrent.futures import ThreadPoolExecutor

    from test_server import post, start_server

    proc, url, lines = start_server(
        # random weights accept little, so the measured-cost gate would shut verify rounds off at
        # 2 live (engine.gate): the count alone here, as this tests the batched rounds' mechanics
        dict(cli_env, MLXCEL_GATE_COUNT_ONLY="1"),
        "-m",
        str(dirs["qwen3"]),
        "--spec-type",
        "draft-dflash",
        "-md",
        str(dirs["draft"]),
        "-np",
        "2",
    )
    try:
        assert any("speculative=dflash" in ln for ln in lines)
        prompts = ["abcabcabc", "hello there, hello"]
        bodies = [{"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True} for p in prompts]
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda b: post(url + "/v1/completions", b), bodies))
        for (status, r), prompt in zip(got, prompts):
            assert status == 200, r
            t = r["timings"]
            assert t["draft_kind"] == "dflash" and t["draft_rounds"] > 0 and t["draft_n"] >= t["draft_n_accepted"]
            cli = subprocess.run(
                mlxcel_cmd()
                + [
                    "generate",
                    "-m",
                    str(dirs["qwen3"]),
                    "-p",
                    prompt,
                    "-n",
                    "24",
                    "--ignore-eos",
                    "--no-chat-template",
                ],
                capture_output=True,
                text=True,
                env=cli_env,
                timeout=300,
            )
            assert cli.stdout.rstrip("\n") == r["choices"][0]["text"].rstrip("\n")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bench_runs_a_detected_dflash_drafter_beside_prompt_lookup(dirs, cli_env, tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text('{"kind": "edit", "prompt": "abcabcabcabc"}\n')
    out = tmp_path / "b.json"
    r = subprocess.run(
        mlxcel_cmd()
        + ["bench", "-m", str(dirs["qwen3"]), "--draft-model", str(dirs["draft"]), "--prompt-lookup"]
        + ["--workload", str(w), "--max-tokens", "12", "--json", str(out)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    # the checkpoint's block of 8; both flags also run the composite (drafters/composite.py)
    assert data["configs"] == ["plain", "dflash k=7", "prompt-lookup k=7", "prompt-lookup+dflash k=7/7"]
    assert all(s["identical"] == s["prompts"] for s in data["summary"])


def test_a_quantized_drafter_loads_and_stays_exact(dirs, tmp_path):
    cfg = tiny_models.dflash_config(QWEN3, layers=1, quantization={"group_size": 32, "bits": 4})
    mx.random.seed(7)
    net = DFlashNet(dflash.read_spec(cfg, tmp_path, cfg["num_target_layers"]))
    nn.quantize(net, group_size=32, bits=4)
    folder = tiny_models.dflash_checkpoint(tmp_path / "q4", cfg, params=dict(tree_flatten(net.parameters())))
    s = session(dirs["qwen3"], draft_model=folder)
    assert isinstance(s.drafters.net.fc, nn.QuantizedLinear)
    equal_to_plain(s, copy_prompts(2, seed=9), 20, sampled=False)


@pytest.mark.parametrize(
    "edit,message",
    [
        # a config.json's sizes are checked for every model it belongs to (models/config.py)
        (lambda c: c.update(hidden_size="abc"), r"'hidden_size' must be a whole number from 1 to 131072, got 'abc'"),
        (
            lambda c: c.update(num_attention_heads=0),
            r"'num_attention_heads' must be a whole number from 1 to 4096, got 0",
        ),
        (lambda c: c.update(num_hidden_layers=65), r"num_hidden_layers 65 is outside 1..64"),  # DFlash's own bound
        (lambda c: c.update(dflash_config=[1]), r"dflash_config is not an object"),
        (lambda c: c["dflash_config"].update(target_layer_ids=None, mask_token_id="m"), r"malformed DFlash field"),
    ],
)
def test_hostile_configs_are_one_line_errors(dirs, tmp_path, no_weights, edit, message):
    d = edited(dirs["draft"], tmp_path / "d", edit)
    with pytest.raises(ModelError, match=message):
        session(dirs["qwen3"], draft_model=d)


def chat_and_run_equal_plain(target, draft, cli_env, *, loaded: str, kind: str) -> None:
    """chat (piped stdin, two turns: the second reuses the first's caches) and run, with the
    drafter, print what they print without it."""
    for cmd in (["chat", "-m", str(target)], ["run", str(target)]):
        args = mlxcel_cmd() + cmd + ["-n", "16"]
        turns = "abcabcabc\nhello hello hello\n"
        plain = subprocess.run(args, input=turns, capture_output=True, text=True, env=cli_env, timeout=300)
        spec = subprocess.run(
            args + ["--draft-model", str(draft), "--profile"],
            input=turns,
            capture_output=True,
            text=True,
            env=cli_env,
            timeout=300,
        )
        assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
        assert spec.stdout == plain.stdout and spec.stdout.strip()
        assert loaded in spec.stderr and f"{kind}: " in spec.stderr and "Traceback" not in spec.stderr


def test_chat_and_run_with_a_dflash_drafter_equal_plain(dirs, cli_env):
    chat_and_run_equal_plain(dirs["qwen3"], dirs["draft"], cli_env, loaded="DFlash drafter:", kind="dflash")

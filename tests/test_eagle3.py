"""The EAGLE-3 drafter (`--draft-kind eagle3`, or an EAGLE-3 folder as --draft-model).

Checkpoints in both published layouts (EAGLE's `LlamaForCausalLMEagle3` with `midlayer.*`, vLLM
speculators' `Eagle3Speculator` with `layers.0.*`), with a draft vocabulary smaller than the
target's mapped through d2t. Random weights prove exactness on a plain Qwen3 target (fused layers
and mlx-lm's), a Llama and a hybrid Qwen3.5; a pair trained on a synthetic pattern (the target as
for DFlash, the drafter on its tapped features) proves the forward: drafts accepted, fully and
partially, from the incremental cache. Then the lossless p/q rule with q = 0 off the mapped set,
every refusal before any weight loads, and the CLI, server and bench faces.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from collections import Counter

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest
import tiny_models
from conftest import mlxcel_cmd, write_byte_tokenizer
from mlx.utils import tree_flatten
from test_dflash import (
    chat_and_run_equal_plain,
    edited,
    equal_to_plain,
    pattern_rounds,
    plain_engine,
    session,
    tree_gain,
)
from test_engine import run
from test_families import copy_prompts

from mlxcel_py.drafters import eagle3, eagle3_kernel
from mlxcel_py.drafters.eagle3_net import Eagle3Net
from mlxcel_py.errors import ModelError
from mlxcel_py.models import decoder_layers
from mlxcel_py.models.taps import layer_tap, lm_head_and_embed
from mlxcel_py.options import SamplingOptions

QWEN3, QWEN35 = tiny_models.QWEN3, tiny_models.QWEN35


def same(s, prompts, n, **kw):
    return equal_to_plain(s, prompts, n, kind="eagle3", **kw)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    return {
        "qwen3": tiny_models.build(root / "qwen3", QWEN3, seed=1, scale=0.5),
        "hybrid": tiny_models.build(root / "hybrid", QWEN35, scale=0.2),
        "draft": tiny_models.eagle3_checkpoint(root / "draft", tiny_models.eagle3_config(QWEN3)),
        "speculators": tiny_models.eagle3_checkpoint(
            root / "speculators", tiny_models.eagle3_config(QWEN3, ids=(1, 2, 4), speculators=True)
        ),
        "hybrid_draft": tiny_models.eagle3_checkpoint(root / "hd", tiny_models.eagle3_config(QWEN35, ids=(1, 2, 3))),
    }


def test_auto_detected_and_equal_to_plain_with_a_mapped_draft_vocabulary(dirs):
    s = session(dirs["qwen3"], draft_model=dirs["draft"])  # no --draft-kind: the folder says eagle3
    d = s.engine.draft
    assert (d.kind, d.block_size) == ("eagle3", 4)
    assert decoder_layers.fused(s.engine.model)
    s.engine.warmup()
    plain = plain_engine(s)
    for p in copy_prompts(3, seed=1):
        toks, g = run(s.engine, p, max_tokens=30, ignore_eos=True)
        assert toks == run(plain, p, max_tokens=30, ignore_eos=True)[0]
        assert g.stats.draft_kind == "eagle3" and g.stats.proposed > 0
    drafter = s.engine.make_drafter()
    assert drafter.mapped.tolist() == [i * 260 // 200 for i in range(200)]  # d + d2t[d]
    same(s, copy_prompts(2, seed=2), 24)


def test_speculators_layout_unfused_layers_and_declared_width(dirs):
    s = session(dirs["qwen3"], draft_model=dirs["speculators"], draft_kind="eagle3")
    assert s.engine.draft.block_size == 3  # speculators_config.num_speculative_tokens
    with decoder_layers.unfused(s.engine.model):
        same(s, copy_prompts(2, seed=3), 24)


def test_hybrid_and_llama_targets(dirs, tiny_dir, tmp_path):
    same(session(dirs["hybrid"], draft_model=dirs["hybrid_draft"]), copy_prompts(2, seed=4), 24)
    llama = tiny_models.eagle3_checkpoint(
        tmp_path / "llama",
        tiny_models.eagle3_config({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 260}, ids=(1, 1, 2)),
    )
    same(session(tiny_dir, draft_model=llama), copy_prompts(2, seed=5), 24)


def test_drafts_stay_inside_the_mapped_vocabulary_and_pq_keeps_the_distribution(dirs):
    """q is 0 off the mapped set, so a sampled draft is always a mapped token; the p/q rule keeps
    the target's distribution (chi-square), with some drafts accepted."""
    from test_draft_model import ALPHA, chi2_sf

    s = session(dirs["hybrid"], draft_model=dirs["hybrid_draft"])
    plain = plain_engine(s)
    start = copy_prompts(1, seed=8)[0][:10]
    prefix = start + run(plain, start, max_tokens=20, ignore_eos=True)[0]
    # map the draft vocabulary onto the tokens the target produces most, so drafts get accepted
    likely = [t for t, _ in Counter(prefix).most_common()] + [t for t in range(260) if t not in prefix]
    draft = tiny_models.eagle3_checkpoint(
        dirs["hybrid"].parent / "likely", tiny_models.eagle3_config(QWEN35, draft_vocab=6), draft_ids=likely[:6]
    )
    s = session(dirs["hybrid"], draft_model=draft, draft_acceptance="p-q")
    drafter = s.engine.make_drafter()
    mapped = set(drafter.mapped.tolist())
    samp = dict(temp=1.0, top_k=5)
    n = 500
    got, want, acc, prop = Counter(), Counter(), 0, 0
    for seed in range(n):
        a, g = run(s.engine, prefix, max_tokens=2, sampling=SamplingOptions(**samp, seed=seed), ignore_eos=True)
        acc, prop = acc + g.stats.accepted, prop + g.stats.proposed
        got[tuple(a)] += 1
        b, _ = run(plain, prefix, max_tokens=2, sampling=SamplingOptions(**samp, seed=10**6 + seed))
        want[tuple(b)] += 1
    assert 0 < acc < prop
    keys = [k for k in set(got) | set(want) if got[k] + want[k] >= 10]
    rest = (n - sum(got[k] for k in keys), n - sum(want[k] for k in keys))
    table = [(got[k], want[k]) for k in keys] + ([rest] if sum(rest) >= 10 else [])
    assert len(table) >= 3
    assert chi2_sf(sum((a - b) ** 2 / (a + b) for a, b in table), len(table) - 1) > ALPHA
    # a sampled proposal only holds mapped tokens
    from mlxcel_py.engine.cache import SequenceCache
    from mlxcel_py.engine.sampling import Decider

    for seed in range(20):
        cache = SequenceCache(s.engine.model)
        cache.keep_hidden(drafter.hidden_tap)
        cache.prefill(prefix[:-1])
        drafter.begin(prefix, cache)
        dec = Decider(SamplingOptions(temp=1.5, seed=seed), prompt_len=len(prefix), vocab_size=260, pq_drafts=True)
        proposal = drafter.propose(prefix, 3, dec)
        assert set(proposal.tokens) <= mapped
        off = [t for t in range(260) if t not in mapped]
        assert mx.max(proposal.q[:, mx.array(off)]).item() == 0.0


# ---- the forward, proven on a trained pair -------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from mlx_lm.models import qwen3
    from mlx_lm.utils import save_config, save_model

    root = tmp_path_factory.mktemp("eagle3-trained")
    rng = random.Random(1)
    cfg = dict(QWEN3, num_hidden_layers=4)
    mx.random.seed(1)
    target = qwen3.Model(qwen3.ModelArgs.from_dict(cfg))
    assert tiny_models.train_target(target, rng, steps=300, lr=3e-3) < 0.5
    lo, m = tiny_models.PATTERN_LO, tiny_models.PATTERN_M
    # the draft vocabulary: the pattern's tokens and a few others
    draft_ids = list(range(lo - 8, lo + m + 8))
    ecfg = tiny_models.eagle3_config(cfg, ids=(1, 2, 4), draft_vocab=len(draft_ids))
    spec = eagle3.read_spec(ecfg, root, 4)
    net = Eagle3Net(spec)
    net.d2t = mx.array([t - d for d, t in enumerate(draft_ids)], dtype=mx.int32)
    net.freeze(keys=["d2t"])
    tap = layer_tap(target, (0, 1, 3))
    _, embed = lm_head_and_embed(target)
    to_draft = {t: d for d, t in enumerate(draft_ids)}
    target.freeze()
    opt = optim.AdamW(3e-3)

    def loss_fn(net, features, x):
        # pairs (f_t, x_{t+1}) predict x_{t+2}, all at once (causal)
        logits, _ = net.step(embed(x[:, 1:-1]), net.features(features[:, :-2]), None)
        labels = mx.array([[to_draft[t] for t in row] for row in x[:, 2:].tolist()])
        return nn.losses.cross_entropy(logits, labels).mean()

    step = nn.value_and_grad(net, loss_fn)
    for _ in range(300):
        x = mx.array([tiny_models.pattern(rng, 32) for _ in range(4)])
        target(x)
        loss, grads = step(net, mx.stop_gradient(tap.last), x)
        opt.update(net, grads)
        mx.eval(net.parameters(), opt.state)
    target.unfreeze()
    folder = root / "target"
    folder.mkdir()
    save_model(folder, target)
    save_config(dict(cfg), folder / "config.json")
    write_byte_tokenizer(folder)
    params = dict(tree_flatten(net.parameters()))
    draft = tiny_models.eagle3_checkpoint(root / "draft", ecfg, params=params, draft_ids=draft_ids)
    return folder, draft, rng


def test_trained_drafter_drafts_are_accepted_fully_and_partially(trained):
    folder, draft, rng = trained
    # trained on the first step only (no EAGLE training-time test): its later, self-fed steps are
    # weaker, so two drafts a round
    s = session(folder, draft_model=draft, draft_block_size=2)
    proposed, accepted, rounds = pattern_rounds(s, rng, 4)
    # the first draft of a round reads the target's real features: what the drafter was trained on
    first = sum(a >= 1 for _, a in rounds) / len(rounds)
    assert first > 0.8, (first, accepted, proposed)  # random weights: next to 0
    assert any(n == a for n, a in rounds) and any(0 < a < n for n, a in rounds)


def test_draft_bits_other_than_q4_or_q8_are_refused(tmp_path, monkeypatch):
    from mlxcel_py.cpu.extension import kernel_status

    if kernel_status()[0] is None:
        pytest.skip("the row-exact kernel did not build here")
    spec = eagle3.read_spec(tiny_models.eagle3_config(QWEN3), tmp_path, QWEN3["num_hidden_layers"])
    monkeypatch.setenv("MLXCEL_DRAFT_BITS", "q3")
    with pytest.raises(ModelError, match=r"MLXCEL_DRAFT_BITS=q3: the drafter's weights are q4 \(the default\) or q8"):
        eagle3.on_the_kernel(Eagle3Net(spec))
    monkeypatch.setenv("MLXCEL_DRAFT_BITS", "q8")
    net = eagle3.on_the_kernel(Eagle3Net(spec))
    assert {m.bits for m in (net.lm_head, net.midlayer.mlp.down_proj)} == {8} and net.fused is not None


def test_a_long_unseen_stretch_restarts_the_drafter_on_its_tail(trained, monkeypatch):
    """Past CATCH_UP unseen positions (a long prompt; a composite's lookup side took many tokens)
    the drafter's cache starts over on the newest ones: a round feeds at most CATCH_UP rows, its
    drafts are still accepted (rope is relative) and output still equals plain."""
    folder, draft, rng = trained
    monkeypatch.setattr(eagle3.Eagle3Drafter, "CATCH_UP", 4)
    fed = []
    step = Eagle3Net.step

    def counting(self, embedded, hidden, cache, **kw):
        fed.append(hidden.shape[1])
        return step(self, embedded, hidden, cache, **kw)

    monkeypatch.setattr(Eagle3Net, "step", counting)
    s = session(folder, draft_model=draft, draft_block_size=2)
    _, _, rounds = pattern_rounds(s, rng, 3)  # 12-token prompts: each first round restarts
    assert max(fed) == 4 and fed.count(4) >= 3, fed
    # the rounds right after a restart see 4 positions of the pattern, not 12: a few more misses
    assert sum(a >= 1 for _, a in rounds) / len(rounds) > 0.6, rounds


def test_trained_drafter_runner_up_trees_take_branches_and_yield_more_per_round(trained):
    """Each step's runner-ups as leaves (its first draft reads the target's features): output
    still equals plain, some rounds accept a runner-up, and a round yields more tokens."""
    folder, draft, _ = trained
    chain, _ = tree_gain(session(folder, draft_model=draft, draft_block_size=2), seed=11)
    tree, branches = tree_gain(session(folder, draft_model=draft, draft_block_size=2, draft_tree_budget=3), seed=11)
    assert branches > 0 and tree > chain, (chain, tree, branches)


def test_fused_midlayer_is_the_network_code_up_to_rounding(tmp_path):
    """The midlayer as one kernel op (eagle3_kernel.py, on wherever the kernel runs) computes
    what the network's MLX code computes, over a catch-up block and self-fed steps: the same
    logits up to float32 rounding, the same cache length, the same picks."""
    from mlxcel_py.cpu.extension import kernel_status

    if kernel_status()[0] is None:
        pytest.skip("the row-exact kernel did not build here")
    spec = eagle3.read_spec(tiny_models.eagle3_config(QWEN3), tmp_path, QWEN3["num_hidden_layers"])
    mx.random.seed(3)
    net = eagle3.on_the_kernel(Eagle3Net(spec))
    assert net.fused is not None, eagle3_kernel.why_not(net)
    emb, hid = mx.random.normal((1, 12, spec.hidden_size)), mx.random.normal((1, 12, spec.hidden_size))

    def steps(fused):
        net.fused = fused
        cache = net.make_cache()
        logits, out = net.step(emb[:, :8], hid[:, :8], cache, last_only=True)
        rows = [logits[0, -1]]
        for i in range(8, 12):
            logits, out = net.step(emb[:, i : i + 1], out, cache)
            rows.append(logits[0, -1])
        return mx.stack(rows), cache[0].offset

    fused = net.fused
    (a, n_a), (b, n_b) = steps(fused), steps(None)
    assert n_a == n_b == 12
    assert mx.allclose(a, b, rtol=1e-4, atol=1e-4).item(), mx.abs(a - b).max().item()
    assert mx.argmax(a, -1).tolist() == mx.argmax(b, -1).tolist()


# ---- refusals: each before any target weight loads ----------------------------------------------


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c.update(hidden_size=32), r"the drafter's hidden_size \(32\) is not the target's \(64\)"),
        (lambda c: c.update(vocab_size=300), r"the drafter's vocab_size \(300\) is not the target's \(260\)"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 2, 5]), r"names 5 \(outside 1..4"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 2, 3]), r"names 0 \(the embedding"),
        (lambda c: c.update(num_hidden_layers=2), r"has one decoder layer; config.json declares 2"),
        (lambda c: c.update(intermediate_size=64), r"tensor midlayer.mlp.gate_proj.weight has shape \[128, 64\]"),
        (lambda c: c.update(target_hidden_size=128), r"differs from the one it reads \(target_hidden_size 128\)"),
        # a config.json's sizes are checked for every model it belongs to (models/config.py)
        (lambda c: c.update(num_attention_heads=0), r"'num_attention_heads' must be a whole number from 1 to 4096"),
        (lambda c: c.update(rope_theta="fast"), r"malformed EAGLE-3 field"),
    ],
)
def test_refuses_a_drafter_that_does_not_fit(dirs, tmp_path, no_weights, edit, message):
    d = edited(dirs["draft"], tmp_path / "d", edit)
    with pytest.raises(ModelError, match=message):
        session(dirs["qwen3"], draft_model=d)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda t: t.pop("midlayer.self_attn.q_proj.weight"), r"tensor midlayer.self_attn.q_proj.weight is missing"),
        (lambda t: t.update(d2t=t["d2t"] + 200), r"d2t maps draft ids to target id \d+, outside the target's"),
        (lambda t: t.pop("d2t"), r"the draft vocabulary \(200\) is smaller than the target's, but .* no d2t"),
    ],
)
def test_refuses_damaged_tensors(dirs, tmp_path, no_weights, change, message):
    d = tmp_path / "d"
    shutil.copytree(dirs["draft"], d)
    tensors = dict(mx.load(str(d / "model.safetensors")))
    change(tensors)
    mx.save_safetensors(str(d / "model.safetensors"), tensors)
    with pytest.raises(ModelError, match=message):
        session(dirs["qwen3"], draft_model=d)


def test_refuses_eagle3_as_the_model_as_a_full_model_and_the_kind_on_another_folder(dirs, no_weights):
    with pytest.raises(ModelError, match="is an EAGLE-3 speculative drafter, not a standalone model; pass its"):
        session(dirs["draft"])
    with pytest.raises(
        ModelError, match="is an EAGLE-3 speculative drafter, not a standalone model; use --draft-kind eagle3"
    ):
        session(dirs["qwen3"], draft_model=dirs["draft"], draft_kind="full-model")
    with pytest.raises(ModelError, match="is not an EAGLE-3 drafter"):
        session(dirs["qwen3"], draft_model=dirs["qwen3"], draft_kind="eagle3")


# ---- the faces -----------------------------------------------------------------------------------


def test_cli_generate_serve_and_bench(dirs, cli_env, tmp_path):
    from test_server import post, start_server

    args = ["generate", "-m", str(dirs["qwen3"]), "-p", "abcabcabc", "-n", "20", "--ignore-eos", "--no-chat-template"]
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
    assert f"speculative=eagle3 (draft_model={dirs['draft']}, block_size=4, default)" in spec.stderr
    assert re.search(r"^\[Speculative acceptance\] rule=greedy-argmax rounds=\d+ .* kind=eagle3$", spec.stderr, re.M)

    proc, url, lines = start_server(
        cli_env, "-m", str(dirs["qwen3"]), "--spec-type", "draft-eagle3", "-md", str(dirs["draft"])
    )
    try:
        assert any("speculative=eagle3" in ln for ln in lines)
        body = {"prompt": "abcabcabc", "max_tokens": 20, "temperature": 0, "ignore_eos": True}
        status, r = post(url + "/v1/completions", body)
        assert status == 200, r
        assert r["timings"]["draft_kind"] == "eagle3" and r["timings"]["draft_rounds"] > 0
        assert r["choices"][0]["text"].rstrip("\n") == plain.stdout.rstrip("\n")
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    w = tmp_path / "w.jsonl"
    w.write_text('{"kind": "edit", "prompt": "abcabcabcabc"}\n')
    out = tmp_path / "b.json"
    r = subprocess.run(
        mlxcel_cmd()
        + ["bench", "-m", str(dirs["qwen3"]), "--draft-model", str(dirs["speculators"])]
        + ["--workload", str(w), "--max-tokens", "12", "--json", str(out)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["configs"] == ["plain", "eagle3 k=3"]
    assert all(s["identical"] == s["prompts"] for s in data["summary"])


def test_chat_and_run_with_an_eagle3_drafter_equal_plain(dirs, cli_env):
    chat_and_run_equal_plain(dirs["qwen3"], dirs["draft"], cli_env, loaded="EAGLE-3 drafter:", kind="eagle3")

"""The MTP drafter (`--draft-kind mtp`): a tiny Qwen3.5 hybrid carrying `mtp.*` tensors.

Exactness (greedy and seeded sampling equal plain decoding, p/q keeps the distribution), both
accept and reject paths, the head's cache re-fed with the target's real hidden states, the
separate-checkpoint form with auto-detection, and one test per refusal (no target weight loaded).
Random weights prove mechanics, never acceptance rates.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter

import mlx.core as mx
import pytest
import tiny_models
from conftest import mlxcel_cmd
from test_engine import run
from test_families import copy_prompts

from mlxcel_py.commands._options import build_options
from mlxcel_py.drafters import mtp
from mlxcel_py.errors import ModelError
from mlxcel_py.options import SamplingOptions
from mlxcel_py.session import open_session
from mlxcel_py.validate import validate

QWEN = tiny_models.QWEN35
COLLAPSING = 0.2  # Qwen3.5 at this scale settles into repeating one token: the echo head's drafts come true


@pytest.fixture(scope="module")
def mtp_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    return {
        "echo": tiny_models.build(
            root / "echo", QWEN, scale=COLLAPSING, extra=tiny_models.mtp_tensors(QWEN, kind="echo")
        ),
        "random": tiny_models.build(root / "random", QWEN, extra=tiny_models.mtp_tensors(QWEN, kind="random")),
        "noisy": tiny_models.build(
            root / "noisy", QWEN, scale=COLLAPSING, extra=tiny_models.mtp_tensors(QWEN, kind="echo", noise=0.3)
        ),
        "plain": tiny_models.build(root / "plain", QWEN),  # no head
        "head": tiny_models.build_mtp_checkpoint(root / "head", QWEN, config={"block_size": 3}),
    }


def session(target, draft_model=None, **params):
    opts = {"prompt": "x", "model": str(target), **params}
    if draft_model is not None:
        opts["draft_model"] = str(draft_model)
    return open_session(validate(build_options("generate", opts)))


@pytest.fixture(scope="module")
def sessions(mtp_dirs):
    return {k: session(mtp_dirs[k], draft_kind="mtp") for k in ("echo", "random", "noisy")}


def plain_engine(s):
    from mlxcel_py.engine.engine import Engine

    return Engine(s.engine.model, eos_ids=s.engine.eos_ids, vocab_size=s.target.vocab_size, context_length=2048)


def speculate_like_plain(s, prompt_list, max_tokens: int) -> tuple[int, int]:
    """Greedy and seeded sampled output equal plain decoding's (sampled: the default sampler-match).
    Returns (proposed, accepted) over all runs."""
    plain = plain_engine(s)
    proposed = accepted = 0
    for i, p in enumerate(prompt_list):
        for sampling in (SamplingOptions(), SamplingOptions(temp=0.8, seed=i)):
            a, _ = run(plain, p, max_tokens=max_tokens, sampling=sampling, ignore_eos=True)
            b, g = run(s.engine, p, max_tokens=max_tokens, sampling=sampling, ignore_eos=True)
            assert a == b, i  # sampled too: drafts drawn with the target's keys (sampler-match)
            if sampling.greedy:
                assert g.stats.acceptance_rule == "greedy-argmax"
            else:
                assert g.stats.acceptance_rule == "sampler-match" and len(b) == max_tokens
            assert g.stats.draft_kind == "mtp" and g.stats.drafted_rounds > 0
            proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    return proposed, accepted


@pytest.mark.parametrize("head", ["echo", "random"])
def test_mtp_greedy_and_seeded_sampling_equal_plain(sessions, head):
    s = sessions[head]
    assert s.engine.draft.kind == "mtp" and s.engine.draft.block_size == 4
    s.engine.warmup()
    proposed, accepted = speculate_like_plain(s, copy_prompts(6, seed=2), 40)
    assert proposed > accepted  # rejections: the head's cache and the target's rolled back
    if head == "echo":
        assert accepted > proposed / 4  # and long accepted runs once the output repeats


def test_mtp_head_is_refed_with_the_targets_real_hidden_states(sessions):
    """After generation the head's cache holds one entry per committed pair (h_j, x_{j+1}), built
    from the target's own hidden states: equal to a head cache fed all real pairs at once."""
    s = sessions["random"]
    eng = s.engine
    p = copy_prompts(1, seed=5)[0]
    toks, g = run(eng, p, max_tokens=30, ignore_eos=True)
    assert g.stats.proposed > g.stats.accepted  # self-fed entries were dropped on the way
    drafter = eng.make_drafter()
    history = p + toks
    # the last proposal's own entries go; then every real pair up to the newest committed one
    drafter._trim_self_fed()
    n = drafter.base + len(drafter.tokens)
    from mlxcel_py.models.taps import lm_head_and_embed, text_model

    _, embed = lm_head_and_embed(eng.model)
    h = text_model(eng.model)[1](mx.array([history[:n]]))  # real hidden states h_0 .. h_{n-1}
    ref = eng.drafters.head.make_cache()
    eng.drafters.head(embed(mx.array([history[drafter.base + 1 : n + 1]])), h[:, drafter.base : n], ref)
    got = drafter.cache[0]
    assert got.offset == ref[0].offset == n - drafter.base
    assert drafter.tokens == history[drafter.base + 1 : n + 1]
    assert mx.allclose(got.keys[..., : got.offset, :], ref[0].keys[..., : got.offset, :], atol=1e-4).item()


def test_mtp_lossless_pq_keeps_the_target_distribution(mtp_dirs):
    from test_draft_model import ALPHA, chi2_sf

    s = session(mtp_dirs["noisy"], draft_kind="mtp", draft_acceptance="p-q")
    plain = plain_engine(s)
    start = copy_prompts(1, seed=8)[0][:10]
    # a prefix whose greedy continuation already repeats: the echo head's q overlaps p there
    prefix = start + run(plain, start, max_tokens=20, ignore_eos=True)[0]
    samp = dict(temp=1.0, top_k=5)
    n = 500
    got, want, acc, prop = Counter(), Counter(), 0, 0
    for seed in range(n):
        a, g = run(s.engine, prefix, max_tokens=2, sampling=SamplingOptions(**samp, seed=seed), ignore_eos=True)
        acc, prop = acc + g.stats.accepted, prop + g.stats.proposed
        got[tuple(a)] += 1
        want[
            tuple(
                run(plain, prefix, max_tokens=2, sampling=SamplingOptions(**samp, seed=10**6 + seed), ignore_eos=True)[
                    0
                ]
            )
        ] += 1
    assert 0 < acc < prop
    keys = [k for k in set(got) | set(want) if got[k] + want[k] >= 10]
    rest = (n - sum(got[k] for k in keys), n - sum(want[k] for k in keys))
    table = [(got[k], want[k]) for k in keys] + ([rest] if sum(rest) >= 10 else [])
    assert len(table) >= 3
    assert chi2_sf(sum((a - b) ** 2 / (a + b) for a, b in table), len(table) - 1) > ALPHA


def test_separate_mtp_checkpoint_is_auto_detected_with_its_width(mtp_dirs):
    s = session(mtp_dirs["plain"], draft_model=mtp_dirs["head"])  # no --draft-kind
    d = s.engine.draft
    assert (d.kind, d.block_size, d.block_explicit) == ("mtp", 3, False)  # the checkpoint's block_size
    assert isinstance(s.drafters, mtp.Source)  # no standalone draft model was loaded
    plain = plain_engine(s)
    p = copy_prompts(1, seed=3)[0]
    a, _ = run(plain, p, max_tokens=24, ignore_eos=True)
    b, g = run(s.engine, p, max_tokens=24, ignore_eos=True)
    assert a == b and g.stats.draft_kind == "mtp" and g.stats.proposed > 0
    explicit = session(mtp_dirs["plain"], draft_model=mtp_dirs["head"], draft_block_size=2)
    assert explicit.engine.draft.block_size == 2 and explicit.engine.draft.block_explicit


def test_cli_generate_mtp_profile_and_startup_line(mtp_dirs, cli_env):
    import subprocess

    args = [
        "generate",
        "-m",
        str(mtp_dirs["echo"]),
        "-p",
        "abcabcabc",
        "-n",
        "24",
        "--ignore-eos",
        "--no-chat-template",
    ]
    plain = subprocess.run(mlxcel_cmd() + args, capture_output=True, text=True, env=cli_env, timeout=300)
    spec = subprocess.run(
        mlxcel_cmd() + args + ["--draft-kind", "mtp", "--profile"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    assert "speculative=mtp (head=target checkpoint, block_size=4, default)" in spec.stderr
    assert re.search(r"^\[Speculative acceptance\] rule=greedy-argmax rounds=\d+ .* kind=mtp$", spec.stderr, re.M)
    assert "Resolved drafter kind: mtp (block_size = 4, default)" in spec.stderr
    assert "Traceback" not in spec.stderr


# ---- refusals: each before any target weight loads ----------------------------------------------


def edited(src, dst, edit):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_refuses_a_target_family_without_mtp(tiny_dir, no_weights):
    with pytest.raises(ModelError, match="the target is a llama model, which has no multi-token-prediction head"):
        session(tiny_dir, draft_kind="mtp")


def test_refuses_a_checkpoint_whose_head_was_dropped(mtp_dirs, no_weights):
    with pytest.raises(ModelError, match="has no MTP head \\(no mtp.fc tensor in its safetensors; mlx-community"):
        session(mtp_dirs["plain"], draft_kind="mtp")


def test_refuses_mtp_num_hidden_layers_zero(mtp_dirs, tmp_path, no_weights):
    d = edited(mtp_dirs["echo"], tmp_path / "zero", lambda c: c.update(mtp_num_hidden_layers=0))
    with pytest.raises(ModelError, match="declares mtp_num_hidden_layers = 0"):
        session(d, draft_kind="mtp")


@pytest.mark.parametrize("key,value", [("hidden_size", 32), ("vocab_size", 300)])
def test_refuses_a_head_of_another_size(mtp_dirs, tmp_path, no_weights, key, value):
    d = edited(mtp_dirs["head"], tmp_path / "other", lambda c: c.update({key: value}))
    with pytest.raises(ModelError, match=f"the MTP head's {key} \\({value}\\) does not match the target's"):
        session(mtp_dirs["plain"], draft_model=d)


def test_refuses_a_head_tensor_of_the_wrong_shape(mtp_dirs, tmp_path, no_weights):
    d = tmp_path / "narrow"
    d.mkdir()
    tensors = tiny_models.mtp_tensors(
        dict(QWEN, hidden_size=32, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8)
    )
    mx.save_safetensors(str(d / "model.safetensors"), tensors)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp"}))
    with pytest.raises(ModelError, match="maps 64 inputs to 32, but the target's hidden size is 64"):
        session(mtp_dirs["plain"], draft_model=d, draft_kind="mtp")


def test_refuses_an_mtp_checkpoint_as_a_full_model_drafter(mtp_dirs, no_weights):
    with pytest.raises(
        ModelError, match="is an MTP head \\(qwen3_5_mtp\\), not a standalone model; use --draft-kind mtp"
    ):
        session(mtp_dirs["plain"], draft_model=mtp_dirs["head"], draft_kind="full-model")
    with pytest.raises(ModelError, match="is an MTP head \\(qwen3_5_mtp\\), not a standalone model; pass its target"):
        session(mtp_dirs["head"])


def test_serve_mtp_reports_draft_kind_in_timings(mtp_dirs, cli_env):
    """The HTTP face on a hybrid target with its MTP head: output equals the plain CLI's, and
    timings name the kind."""
    import subprocess

    from test_server import post, start_server

    proc, url, lines = start_server(cli_env, "-m", str(mtp_dirs["echo"]), "--draft-kind", "mtp")
    try:
        assert any("speculative=mtp" in ln for ln in lines)
        body = {"prompt": "abcabcabc", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        status, r = post(url + "/v1/completions", body)
        assert status == 200, r
        t = r["timings"]
        assert t["draft_kind"] == "mtp" and t["draft_rounds"] > 0 and t["draft_n"] >= t["draft_n_accepted"]
        cli = subprocess.run(
            mlxcel_cmd()
            + [
                "generate",
                "-m",
                str(mtp_dirs["echo"]),
                "-p",
                "abcabcabc",
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


def test_bench_runs_an_auto_detected_mtp_head_beside_prompt_lookup(mtp_dirs, cli_env, tmp_path):
    import subprocess

    w = tmp_path / "w.jsonl"
    w.write_text('{"kind": "edit", "prompt": "abcabcabcabc"}\n')
    out = tmp_path / "b.json"
    r = subprocess.run(
        mlxcel_cmd()
        + [
            "bench",
            "-m",
            str(mtp_dirs["plain"]),
            "--draft-model",
            str(mtp_dirs["head"]),
            "--prompt-lookup",
            "--workload",
            str(w),
            "--max-tokens",
            "12",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    # the head's declared width; both flags also run the composite (drafters/composite.py)
    assert data["configs"] == ["plain", "mtp k=3", "prompt-lookup k=7", "prompt-lookup+mtp k=7/3"]
    assert all(s["identical"] == s["prompts"] for s in data["summary"])


@pytest.mark.parametrize(
    "content,message",
    [
        (b"garbage, not safetensors", "not a readable safetensors file"),
        (b"\xff" * 8 + b"{}", "not a readable safetensors file"),  # a header length past the file's end
        (None, "cannot read its tensors"),  # a valid header whose data was cut off
    ],
)
def test_a_damaged_head_file_is_one_line_error(mtp_dirs, tmp_path, content, message):
    import struct

    d = tmp_path / "damaged"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp"}))
    if content is None:
        header = json.dumps(
            {"mtp.fc.weight": {"dtype": "F32", "shape": [64, 128], "data_offsets": [0, 32768]}}
        ).encode()
        content = struct.pack("<Q", len(header)) + header + b"x" * 100
    (d / "model.safetensors").write_bytes(content)
    with pytest.raises(ModelError, match=message):
        session(mtp_dirs["plain"], draft_model=d)


def test_trained_mtp_head_drafts_are_accepted_fully_and_partially(tmp_path):
    """Random heads prove mechanics only: a tiny Qwen3.5 trained for seconds on a synthetic
    pattern, and an MTP head trained all at once on its real hidden states (pairs (h_t, x_{t+1})
    predicting x_{t+2}), accepted when the head runs incrementally from its cache."""
    import random

    import mlx.nn as nn
    import mlx.optimizers as optim
    from conftest import write_byte_tokenizer
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_5
    from mlx_lm.utils import save_config
    from test_dflash import pattern_rounds

    from mlxcel_py.models.taps import hidden_tap, lm_head_and_embed

    rng = random.Random(0)
    mx.random.seed(0)
    target = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(dict(QWEN)))
    assert tiny_models.train_target(target, rng, steps=200, lr=5e-3, length=24) < 0.5
    head = mtp.MTPHead(dict(QWEN))
    tap = hidden_tap(target)
    lm_head, embed = lm_head_and_embed(target)
    target.freeze()
    opt = optim.AdamW(3e-3)

    def head_loss(head, h, x):
        out = head(embed(x[:, 1:-1]), h[:, :-2], [None] * len(head.layers))  # causal, no cache
        return nn.losses.cross_entropy(lm_head(out), x[:, 2:]).mean()

    step = nn.value_and_grad(head, head_loss)
    for _ in range(300):
        x = mx.array([tiny_models.pattern(rng, 24) for _ in range(4)])
        target(x)
        loss, grads = step(head, mx.stop_gradient(tap.last), x)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state)
    target.unfreeze()
    folder = tmp_path / "trained"
    folder.mkdir()
    weights = dict(tree_flatten(target.parameters()))
    weights.update({"mtp." + k: v for k, v in tree_flatten(head.parameters())})
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    save_config(dict(QWEN), folder / "config.json")
    write_byte_tokenizer(folder)

    s = session(folder, draft_kind="mtp")
    proposed, accepted, rounds = pattern_rounds(s, rng, 3)
    assert accepted > 0.5 * proposed  # random heads accept next to nothing
    assert any(n == a for n, a in rounds) and any(0 < a < n for n, a in rounds)

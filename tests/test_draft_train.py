"""`mlxcel draft train`: a learned drafter trained by the command itself, for a tiny target.

The target is trained on a synthetic pattern behind the chat template (so it answers any prompt
by continuing the pattern); the command records its answers and taps, trains an EAGLE-3 drafter
with the training-time test and writes it in the speculators layout. Then: drafts accepted at
every command's engine with output equal to plain, the card refusing another target, --resume
continuing, refusals before any model loads, and the training-time test's unrolled forward equal
to the incremental drafting path, step for step.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import mlx.core as mx
import pytest
import tiny_models
from conftest import mlxcel_cmd, write_byte_tokenizer
from test_dflash import plain_engine, session
from test_engine import run

from mlxcel_py.drafters.eagle3_net import Eagle3Net, Spec
from mlxcel_py.errors import ModelError
from mlxcel_py.training import ttt

QWEN3 = tiny_models.QWEN3
LO = 40  # the pattern's tokens: the byte tokenizer's ids 40..55 are the letters I..X


def text_of(ids: list[int]) -> str:
    return "".join(chr(33 + i) for i in ids)  # ids 0..93 are the printable ASCII bytes '!'..'~'


def pattern_text(rng, n: int = 10) -> str:
    return text_of(tiny_models.pattern(rng, n, lo=LO))


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny Qwen3 that continues the pattern (prompts go in raw: --no-chat-template)."""
    from mlx_lm.models import qwen3
    from mlx_lm.utils import save_config, save_model

    folder = tmp_path_factory.mktemp("draft-train") / "target"
    folder.mkdir()
    write_byte_tokenizer(folder)
    mx.random.seed(3)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(dict(QWEN3)))
    rng = random.Random(5)
    assert (
        tiny_models.train_target(model, rng, steps=300, lr=3e-3, make=lambda r: tiny_models.pattern(r, 32, lo=LO)) < 0.5
    )
    save_model(folder, model)
    save_config(dict(QWEN3), folder / "config.json")
    return folder


def train(out, model, cli_env, *extra, minutes="0.4", check=True):
    args = [
        *mlxcel_cmd(), "draft", "train", "-m", str(model), "--out", str(out), "--minutes", minutes,
        "--no-builtin-prompts", "--no-chat-template", "--max-answer", "24", "--draft-vocab", "48", "--width", "3",
        "--learning-rate", "3e-3", *extra,
    ]  # fmt: skip
    r = subprocess.run(args, capture_output=True, text=True, env=cli_env, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    folder = target
    root = tmp_path_factory.mktemp("drafter")
    rng = random.Random(9)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": pattern_text(rng)}) + "\n" for i in range(60)))
    env = dict(__import__("os").environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(root / "xdg"))
    out = root / "drafter"
    r = train(out, folder, env, "--prompts", str(prompts))
    return out, prompts, env, r


def test_writes_a_speculators_drafter_with_a_card_and_prints_its_path(trained, target):
    out, _, _, r = trained
    assert r.stdout.strip().splitlines()[-1] == str(out)  # stdout: the folder, for scripts
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["draft_vocab_size"] == 48
    weights = mx.load(str(out / "model.safetensors"))
    assert weights["d2t"].shape == (48,) and weights["t2d"].shape == (260,) and weights["t2d"].sum().item() == 48
    assert "layers.0.self_attn.q_proj.weight" in weights
    card = json.loads((out / "mlxcel_card.json").read_text())
    assert card["target"]["path"] == str(target) and len(card["target"]["fingerprint"]) == 64
    # measured on held-out prompts while training: most of a round's 3 drafts are right
    assert card["measured"]["held_out_accepted_per_round"] > 1.5, card
    assert "drafts accepted a round" in r.stderr


def test_trained_drafts_are_accepted_and_output_equals_plain(trained, target):
    out, _, _, _ = trained
    s = session(target, draft_model=out)
    assert s.engine.draft.kind == "eagle3" and s.drafters.width == 3  # the width the card's config declares
    plain = plain_engine(s)
    rng = random.Random(21)
    proposed = accepted = 0
    for _ in range(4):
        ids = tiny_models.pattern(rng, 10, lo=LO)  # a prompt the training never saw
        a, _ = run(plain, ids, max_tokens=40, ignore_eos=True)
        b, g = run(s.engine, ids, max_tokens=40, ignore_eos=True)
        assert a == b
        proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    assert accepted / proposed > 0.6, (accepted, proposed)  # an untrained drafter: next to 0


def test_cli_generate_with_the_trained_drafter_equals_plain(trained, target):
    out, _, env, _ = trained
    base = [
        *mlxcel_cmd(),
        "generate",
        "-m",
        str(target),
        "-p",
        pattern_text(random.Random(4)),
        "-n",
        "30",
        "--ignore-eos",
        "--no-chat-template",
    ]
    plain = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    spec = subprocess.run(
        [*base, "--draft-model", str(out), "--profile"], capture_output=True, text=True, env=env, timeout=300
    )
    assert plain.returncode == spec.returncode == 0, spec.stderr[-2000:]
    assert spec.stdout == plain.stdout and spec.stdout
    assert "eagle3" in spec.stderr


def test_refused_for_another_target(trained, tmp_path, cli_env):
    out, _, _, _ = trained
    other = tiny_models.build(tmp_path / "other", QWEN3, seed=7)  # same sizes, other weights
    with pytest.raises(ModelError, match="was trained for another target"):
        session(other, draft_model=out)
    r = subprocess.run(
        [*mlxcel_cmd(), "generate", "-m", str(other), "-p", "x", "-n", "4", "--draft-model", str(out)],
        capture_output=True, text=True, env=cli_env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1 and "was trained for another target" in r.stderr and "Traceback" not in r.stderr


def test_resume_continues_the_same_run(trained, target, tmp_path):
    out, prompts, env, _ = trained
    copy = tmp_path / "resumed"
    shutil.copytree(out, copy)
    before = json.loads((copy / ".train" / "state.json").read_text())
    train(copy, target, env, "--prompts", str(prompts), "--resume", minutes=str(before["seconds"] / 60 + 0.15))
    after = json.loads((copy / ".train" / "state.json").read_text())
    assert after["step"] > before["step"] and after["draft_ids"] == before["draft_ids"]
    # the recorded answers are reused, not recorded again (copytree kept the file's time)
    samples = ".train/samples.safetensors"
    assert (copy / samples).stat().st_mtime == (out / samples).stat().st_mtime
    card = json.loads((copy / "mlxcel_card.json").read_text())
    assert card["training"]["steps"] == after["step"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--kind", "medusa"], "--kind medusa: choose one of eagle3, dflash"),
        (["--kind", "dflash"], "training a DFlash drafter is not implemented yet"),
        (["--minutes", "0"], "--minutes 0: must be above 0"),
        (["--draft-vocab", "3"], "--draft-vocab 3: must be at least 16"),
        (["--width", "40"], "--width 40: at most 16"),
        (["--tokens", "99999999999999999999"], "--tokens 99999999999999999999: at most 100,000,000"),
        (["--batch", "-1"], "--batch -1: must be at least 1"),
        (["--batch", "100000"], "--batch 100000: at most 64"),
        (["--max-answer", "1000000"], "--max-answer 1000000: at most 8,192"),
        (["--learning-rate", "nan"], "--learning-rate nan: must be above 0"),
        (["--intermediate-size", "0"], "--intermediate-size 0: must be from 1"),
        (["--no-builtin-prompts"], "--no-builtin-prompts leaves nothing to train on"),
        (["--resume"], "holds no training to resume"),
        (["--prompts", "NOPE.jsonl"], "--prompts NOPE.jsonl"),
    ],
)
def test_refusals_come_before_any_model_loads(args, message, tmp_path, cli_env):
    r = subprocess.run(
        [*mlxcel_cmd(), "draft", "train", "-m", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "o"), *args],
        capture_output=True, text=True, env=cli_env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_a_non_empty_folder_and_a_bad_prompts_line_are_refused(tmp_path, cli_env):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("mine")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{oops\n')
    for args, message in (
        (["--out", str(full)], "the folder is not empty; pass --resume"),
        (["--out", str(tmp_path / "o"), "--prompts", str(bad)], "line 2: not JSON"),
    ):
        r = subprocess.run(
            [*mlxcel_cmd(), "draft", "train", *args], capture_output=True, text=True, env=cli_env, timeout=120
        )
        assert r.returncode == 2 and message in r.stderr, r.stderr
    assert (full / "x").read_text() == "mine"


def test_training_time_test_equals_the_incremental_drafting_path():
    """Step k of `ttt.unrolled` at index j is exactly what the drafter computes k-1 drafts after
    its real pair j (teacher-forced tokens): what is trained is what runs."""
    spec = Spec(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
        vocab_size=50, draft_vocab_size=50, rms_norm_eps=1e-6, aux_layer_ids=(1, 2, 3), rope_theta=10000.0,
    )  # fmt: skip
    mx.random.seed(0)
    net = Eagle3Net(spec)
    embed = __import__("mlx.nn", fromlist=["Embedding"]).Embedding(50, 32)
    T = 12
    feats = mx.random.normal((1, T - 1, 96))
    x = mx.random.randint(0, 50, (1, T)).astype(mx.int32)
    steps = ttt.unrolled(net, embed, feats, x, 3)
    for j in (0, 4, 7):
        cache = net.make_cache()
        logits, out = net.step(embed(x[:, 1 : j + 2]), net.features(feats[:, : j + 1]), cache)
        got = [logits[:, -1]]
        out = out[:, -1:]
        for k in (2, 3):
            logits, out = net.step(embed(x[:, j + k : j + k + 1]), out, cache)
            got.append(logits[:, -1])
        for k, g in enumerate(got):
            want = steps[k][0][:, j]
            assert mx.allclose(g, want, atol=1e-4).item(), (j, k + 1)
            assert steps[k][1][0, j].item() == x[0, j + k + 2].item()  # the label: x_{j+k+1}, k from 1


def test_recorded_labels_are_the_targets_greedy_picks(tmp_path):
    """Every answer position's label is the target's argmax after the tokens before it: the
    answer itself where decoding was greedy, and still the greedy pick where the answer was
    sampled (what greedy verification accepts); prompt positions keep their own ids. (Random
    weights: a target unsure enough that sampling leaves its greedy path.)"""
    from mlxcel_py.models import loading
    from mlxcel_py.training import recording

    m = loading.load(loading.resolve(str(tiny_models.build(tmp_path / "t", QWEN3, seed=2))))
    rng = random.Random(4)
    prompts = [pattern_text(rng, 8) for _ in range(4)]

    def encode(text: str) -> list[int]:
        return [ord(c) - 33 for c in text]

    kw = dict(max_tokens=12, batch=2, seed=1)
    both = list(recording.record(m.model, encode, [], prompts, [0, 1], **kw))
    sampled = list(recording.record(m.model, encode, [], prompts, [0, 1], all_sampled=True, first_index=10, **kw))
    differ = 0
    for s in both + sampled:
        assert len(s.labels) == len(s.tokens) and s.labels[: s.prompt_len] == s.tokens[: s.prompt_len]
        logits = m.model(mx.array([s.tokens[:-1]]))[0]
        assert s.labels[s.prompt_len :] == mx.argmax(logits, -1).tolist()[s.prompt_len - 1 :]
        differ += s.labels != s.tokens
    greedy = [s for s in both if s.labels == s.tokens]
    assert len(greedy) >= 2  # every other answer of the first pass is greedy: labels are the answer
    assert differ > 0  # sampled answers leave the greedy path somewhere, and their labels do not follow them

"""One test per validation rule: exit code 2, the message, and no model loaded (docs/validation.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from mlxcel_py.cli import app
from mlxcel_py.drafters import registry
from mlxcel_py.models import loading

RULES = [
    # (argv, message fragment)
    (
        ["generate", "-p", "x", "--draft-kind", "prompt-lookup"],
        "--draft-kind=prompt-lookup takes no drafter checkpoint; pass --prompt-lookup",
    ),
    (["generate", "-p", "x", "--prompt-lookup-ngram-max", "4"], "--prompt-lookup-ngram-max requires --prompt-lookup"),
    (["generate", "-p", "x", "--prompt-lookup-ngram-min", "1"], "--prompt-lookup-ngram-min requires --prompt-lookup"),
    (["generate", "-p", "x", "--prompt-lookup-max-draft", "4"], "--prompt-lookup-max-draft requires --prompt-lookup"),
    (["generate", "-p", "x", "--prompt-lookup-no-adaptive"], "--prompt-lookup-no-adaptive requires --prompt-lookup"),
    (["generate", "-p", "x", "--prompt-lookup-policy", "gated"], "--prompt-lookup-policy requires --prompt-lookup"),
    (["generate", "--prompt-lookup"], "interactive chat does not support prompt lookup"),
    (["chat", "--prompt-lookup"], "--prompt-lookup is a generate option"),
    (["run", "--prompt-lookup", "-p", "x"], "--prompt-lookup is a generate option"),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--audio", "a.wav"],
        "--audio: audio and video input are not supported",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--video", "a.mp4"],
        "--video: audio and video input are not supported",
    ),
    (["generate", "-p", "x", "--image", "a.png", "--tp-size", "2"], "--image: --tp-size 2 runs are text-only"),
    (["serve", "--mmproj", "mmproj.gguf", "--no-mmproj"], "--mmproj and --no-mmproj contradict each other"),
    (["generate", "-p", "x", "--mmproj", "m.gguf", "--pp-size", "2"], "--mmproj: --pp-size 2 runs are text-only"),
    (["generate", "-p", "x", "--image", "a.png", "--no-mmproj"], "--image needs the vision model, which --no-mmproj"),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--pp-size", "2"],
        "--prompt-lookup does not support pipeline parallelism",
    ),
    (["generate", "-p", "x", "--pp-size", "2"], "--pp-size 2 needs 2 processes started together"),
    (["chat", "--tp-size", "2"], "--tp-size 2 needs 2 processes started together"),
    (["generate", "-p", "x", "--tp-size", "0"], "--tp-size must be at least 1"),
    (["serve", "--pp-size", "0"], "--pp-size must be at least 1"),
    (["serve", "--max-predict-ms", "-1"], "--max-predict-ms must be 0 (no limit) or more milliseconds"),
    (["serve", "--models-dir", ".", "-m", "x"], "--models-dir runs a router that starts one server per model"),
    (["serve", "--models-dir", ".", "--tp-size", "2"], "--models-dir does not run under --tp-size 2"),
    (["serve", "--models-max", "-1"], "--models-max must be 0 (no limit) or more"),
    (["serve", "--sleep-idle-seconds", "0"], "--sleep-idle-seconds must be -1 (never) or 1 or more seconds"),
    (["serve", "--sleep-idle-seconds", "-3"], "--sleep-idle-seconds must be -1 (never) or 1 or more seconds"),
    (
        ["serve", "--sleep-idle-seconds", "60", "--tp-size", "2"],
        "--sleep-idle-seconds does not run under --tp-size 2",
    ),
    (["generate", "-p", "x", "--tp-size", "2", "--pp-size", "2"], "a 2-D layout is not supported"),
    (
        ["generate", "-p", "x", "--tp-size", "2", "--prompt-lookup", "--verify-exact"],
        "--verify-exact does not run under --tp-size 2",
    ),
    (["generate", "-p", "x", "--tp-size", "2", "--draft-model", "d"], "--draft-model does not run under --tp-size 2"),
    (["serve", "--pp-size", "2", "--draft-kind", "mtp"], "--draft-kind mtp does not run under --pp-size 2"),
    (
        ["serve", "--pp-size", "2", "--draft-kind", "prompt-lookup"],
        "--draft-kind prompt-lookup does not support pipeline parallelism",
    ),
    (["chat", "--pp-size", "2", "--draft-kind", "suffix"], "--draft-kind suffix does not support pipeline parallelism"),
    (["launch", "--", "mlxcel", "generate", "-p", "x", "--tp-size", "2"], "mlxcel launch needs -n N"),
    (
        ["launch", "-n", "2", "--", "mlxcel", "generate", "-p", "x"],
        "the command gives neither --tp-size 2 nor --pp-size 2",
    ),
    (
        ["launch", "-n", "3", "--", "mlxcel", "chat", "--tp-size", "2"],
        "the command asks for 2 ranks but the launch starts 3",
    ),
    (["launch", "-n", "2"], "give the command to run after --"),
    (
        ["launch", "-n", "2", "--starting-port", "65535", "--", "mlxcel", "chat", "--tp-size", "2"],
        "--starting-port 65535: rank r listens on PORT + r",
    ),
    (
        ["launch", "--hostfile", "/nonexistent/h.json", "--", "mlxcel", "chat", "--tp-size", "2"],
        "--hostfile /nonexistent/h.json: cannot read it",
    ),
    (["serve", "--draft-kind", "prompt-lookup", "--draft-model", "d"], "prompt-lookup takes no draft model"),
    (["serve", "--spec-type", "ngram-mod"], "--spec-type ngram-mod is not supported"),
    (["serve", "--spec-type", "ngram-simple"], "--spec-type ngram-simple is not supported"),
    (["serve", "--spec-type", "draft-dspark"], "--spec-type draft-dspark is not supported"),
    (
        ["serve", "--spec-type", "draft-mtp", "--draft-kind", "full-model", "--draft-model", "d"],
        "--spec-type draft-mtp conflicts with --draft-kind full-model",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-kind", "mtp"],
        "--prompt-lookup conflicts with --draft-kind mtp",
    ),
    (["serve", "--spec-type", "bogus"], "not a llama-server speculation type"),
    (["serve", "--spec-type", "none,draft-simple"], "--spec-type none cannot be combined"),
    (
        ["serve", "--spec-type", "draft-simple", "--draft-kind", "dflash"],
        "--spec-type draft-simple conflicts with --draft-kind dflash",
    ),
    (
        ["serve", "--draft-kind", "prompt-lookup", "--prompt-lookup-max-batch", "0"],
        "--prompt-lookup-max-batch must be at least 1",
    ),
    (["serve", "-np", "0"], "--parallel (-np) must be between 1 and 256"),
    (["serve", "-c", "32", "-np", "4"], "--ctx-size 32 split across -np 4 leaves 8 tokens a slot (at least 16)"),
    (
        ["serve", "--cors-origins", "https://a.example, not an origin"],
        "--cors-origins: 'not an origin' is not an origin",
    ),
    (["serve", "--cache-ram", "-2"], "--cache-ram must be -1 (no limit), 0 (off) or a size in MiB"),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--prompt-lookup-ngram-min", "0"],
        "--prompt-lookup-ngram-min must be at least 1",
    ),
    (["generate", "-p", "x", "--prompt-lookup", "--prompt-lookup-ngram-max", "17"], "must be at most 16"),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--prompt-lookup-ngram-min", "3", "--prompt-lookup-ngram-max", "2"],
        "must be >= --prompt-lookup-ngram-min",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--prompt-lookup-max-draft", "0"],
        "--prompt-lookup-max-draft must be at least 1",
    ),
    (["generate", "-p", "x", "--prompt-lookup", "--prompt-lookup-max-draft", "65"], "must be at most 64"),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--prompt-lookup-policy", "fastest"],
        "--prompt-lookup-policy fastest is not one of",
    ),
    (["generate", "-p", "x", "--draft-model", "d", "--draft-block-size", "0"], "--draft-block-size must be at least 1"),
    (["generate", "-p", "x", "--draft-kind", "full-model"], "--draft-kind full-model needs --draft-model"),
    (["generate", "-p", "x", "--draft-kind", "eagle"], '--draft-kind="eagle" is not recognised'),
    (
        ["generate", "-p", "x", "--draft-kind", "dflash", "--draft-model", "d", "--draft-block-size", "1"],
        "--draft-block-size 1: a dflash block's first row is the last committed token",
    ),
    (["generate", "-p", "x", "--draft-kind", "dflash"], "--draft-kind dflash needs --draft-model"),
    (["generate", "-p", "x", "--max-tokens", "-5"], "--max-tokens must be -1"),
    (["generate", "-p", "x", "--temp", "-1"], "--temp must be >= 0"),
    (["generate", "-p", "x", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["generate", "-p", "x", "--top-k", "-1"], "--top-k must be >= 0"),
    (["generate", "-p", "x", "--min-p", "2"], "--min-p must be in [0, 1]"),
    (["generate", "-p", "x", "--repetition-penalty", "0"], "--repetition-penalty must be between 0.01 and 100"),
    (["generate", "-p", "x", "--repetition-penalty", "1e-300"], "--repetition-penalty must be between 0.01 and 100"),
    (["generate", "-p", "x", "--repetition-penalty", "1e308"], "--repetition-penalty must be between 0.01 and 100"),
    (["generate", "-p", "x", "--temp", "inf"], "--temp must be a finite number"),
    (["generate", "-p", "x", "--min-tokens", "9", "-n", "3"], "--min-tokens (9) must not exceed --max-tokens (3)"),
    (["generate", "-p", "x", "--cpu-weights", "q9"], "--cpu-weights q9 is not one of auto, q8, q4, f32"),
    (["serve", "--cpu-weights", "q8,q4"], "(a comma list is a bench option)"),
    (
        ["generate", "-p", "x", "--no-dequantize", "--cpu-weights", "q4"],
        "--no-dequantize keeps MLX's own quantized matmul and conflicts with --cpu-weights",
    ),
    (["bench", "--cpu-weights", "f32,q8,f32"], "--cpu-weights f32,q8,f32: a mode is listed twice"),
    (["bench", "--cpu-weights", "f32,,q4"], "--cpu-weights f32,,q4: an empty entry is not one of"),
    (["bench", "--cpu-weights", "f32,q8", "--draft-kind", "mtp"], "the MTP head is loaded onto one target"),
    (["bench", "--sweep-widths", "1,x"], "--sweep-widths 1,x: expected comma-separated integers"),
    (["bench", "--sweep-widths", "0,4"], "--sweep-widths: width 0 is outside 1..64"),
    (["bench", "--sweep-widths", "4,2,4"], "a width is listed twice"),
    (["bench", "--vs", "vllm"], "--vs vllm: the peer to compare against must be one of mlx-lm, llama.cpp"),
    (
        ["bench", "--vs", "llama.cpp", "-m", "/tmp"],
        "--vs llama.cpp runs llama.cpp on the same GGUF file: pass -m FILE.gguf",
    ),
    (["bench", "--limit", "0"], "--limit must be at least 1"),
    (["bench", "--repeats", "0"], "--repeats must be between 1 and 100"),
    (["bench", "--max-tokens", "0"], "--max-tokens must be at least 1 for a benchmark"),
    (["bench", "--workload", "/nonexistent/w.jsonl"], "--workload /nonexistent/w.jsonl: no such file"),
    (
        ["bench", "--json", "/nonexistent/out.json"],
        "--json /nonexistent/out.json: the folder /nonexistent does not exist",
    ),
    (
        ["bench", "--draft-model", "d", "--prompt-lookup-max-draft", "4"],
        "--prompt-lookup-max-draft requires --prompt-lookup",
    ),
    (["bench", "--draft-kind", "prompt-lookup"], "--draft-kind=prompt-lookup takes no drafter checkpoint"),
    (["generate", "-p", "x", "--suffix-store", "s.json"], "--suffix-store requires --draft-kind suffix"),
    (["generate", "-p", "x", "--suffix-cache-tokens", "9"], "--suffix-cache-tokens requires --draft-kind suffix"),
    (["chat", "--draft-kind", "suffix", "--suffix-cache-tokens", "0"], "--suffix-cache-tokens must be at least 1"),
    (
        ["serve", "--draft-kind", "suffix", "--suffix-store", "/nonexistent/s.json"],
        "--suffix-store /nonexistent/s.json: the folder /nonexistent does not exist",
    ),
    (["run", "-p", "x", "--draft-kind", "suffix", "--suffix-store", "/"], "--suffix-store /: a folder"),
    (
        ["generate", "-p", "x", "--draft-kind", "suffix", "--draft-model", "d"],
        "--draft-kind suffix takes no drafter checkpoint",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-kind", "suffix"],
        "--prompt-lookup conflicts with --draft-kind suffix",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-kind", "full-model"],
        "--prompt-lookup conflicts with --draft-kind full-model",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-max", "4"],
        "--draft-block-size (--draft-max) does not apply to --prompt-lookup",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-block-size", "4"],
        "--draft-block-size (--draft-max) does not apply to --prompt-lookup",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft", "4"],  # llama-server's alias of --draft-max
        "--draft-block-size (--draft-max) does not apply to --prompt-lookup",
    ),
    (
        ["bench", "--prompt-lookup", "--draft-block-size", "4"],
        "--draft-block-size (--draft-max) does not apply to --prompt-lookup",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--spec-type", "none"],
        "--spec-type none selects a server drafter and does not combine with --prompt-lookup",
    ),
    (["chat", "--verify-exact"], "--verify-exact is a generate/run option"),
    (["serve", "--verify-exact"], "--verify-exact is a generate/run option"),
    (["serve", "--prompt-lookup-max-batch", "0"], "--prompt-lookup-max-batch must be at least 1"),
    (["serve", "--draft-model", "d", "--prompt-lookup-max-batch", "0"], "--prompt-lookup-max-batch must be at least 1"),
    (["generate", "-p", "x", "--seed", "-2"], "--seed must be -1 (random) or >= 0"),
    # draft trees (engine/tree.py)
    (["generate", "-p", "x", "--draft-tree-budget", "4"], "--draft-tree-budget 4 needs a drafter"),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-tree-budget", "65"],
        "--draft-tree-budget must be between 0 (chains) and 64 nodes",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-tree-budget", "4", "--temp", "0.7"],
        "--draft-tree-budget 4: draft trees are verified greedily only",
    ),
    (
        ["run", "-p", "x", "--draft-model", "d", "--draft-tree-budget", "4", "--json-schema", "{}"],
        "--draft-tree-budget does not combine with a grammar or JSON schema",
    ),
    (
        ["generate", "-p", "x", "--prompt-lookup", "--draft-tree-margin", "1"],
        "--draft-tree-margin requires --draft-tree-budget N",
    ),
    (
        ["serve", "--draft-kind", "suffix", "--draft-tree-budget", "4", "--draft-tree-margin", "1"],
        "--draft-tree-margin applies to model drafters' trees",
    ),
    (
        ["chat", "--draft-model", "d", "--draft-tree-budget", "4", "--draft-tree-margin", "-1"],
        "--draft-tree-margin must be a logit gap of 0 or more",
    ),
    (
        ["serve", "--draft-kind", "prompt-lookup", "--draft-tree-budget", "4", "--tp-size", "2"],
        "--draft-tree-budget does not run under --tp-size 2",
    ),
    (
        ["generate", "-p", "x", "--draft-kind", "mtp", "--mtp-tree-branches", "99"],
        "MLXCEL_MTP_TREE_BRANCHES must be between 0 (chains) and 64 nodes",
    ),
    (
        ["bench", "--prompt-lookup", "--draft-tree-budget", "0,x"],
        "--draft-tree-budget 0,x: a comma list of node counts",
    ),
    (["bench", "--prompt-lookup", "--draft-tree-budget", "4,4"], "--draft-tree-budget 4,4: a budget is listed twice"),
]


@pytest.fixture
def no_loading(monkeypatch):
    calls = []

    def forbidden(*a, **k):
        calls.append(a)
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "resolve", forbidden)
    monkeypatch.setattr(loading, "load", forbidden)
    return calls


@pytest.mark.parametrize("argv,message", RULES, ids=[" ".join(r[0][:4]) + f" #{i}" for i, r in enumerate(RULES)])
def test_rule(argv, message, no_loading, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert len([ln for ln in result.stderr.splitlines() if ln.startswith("error:")]) == 1
    assert no_loading == []


def test_every_rule_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "validation.md").read_text()
    for _, message in RULES:
        assert message.split(" (")[0].strip('"') in doc or message in doc, message


@pytest.mark.parametrize(
    "line,message",
    [
        ("not json", ":1: not valid JSON"),
        ('{"kind": "code"}', ':1: each line needs a non-empty string "prompt"'),
        ('{"kind": "", "prompt": "x"}', ':1: "kind" must be a non-empty string'),
    ],
)
def test_bench_rejects_a_malformed_workload_before_loading(line, message, no_loading, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    w = tmp_path / "w.jsonl"
    w.write_text(line + "\n")
    result = CliRunner().invoke(app, ["bench", "--workload", str(w)])
    assert result.exit_code == 2, result.output
    assert f"--workload {w}{message}" in result.stderr
    assert no_loading == []


def test_bench_plans_each_drafter_at_each_width():
    from mlxcel_py.bench.checks import validate_bench
    from mlxcel_py.commands._options import build_bench_options, build_options

    params = {
        "draft_model": "d",
        "prompt_lookup": True,
        "prompt_lookup_policy": "cost",
        "sweep_widths": "4,1",
        "max_tokens": 64,
    }
    plan = validate_bench(build_options("bench", params), build_bench_options(params))
    assert [(d.kind, registry.width(d)) for d in plan.drafts] == [
        ("full-model", 1),
        ("full-model", 4),
        ("prompt-lookup", 1),
        ("prompt-lookup", 4),
    ]
    assert plan.run.draft.kind == "full-model"  # the session loads the drafter
    assert all(d.lookup.policy == "cost" for d in plan.drafts if d.kind == "prompt-lookup")
    default = validate_bench(build_options("bench", {"max_tokens": 64}), build_bench_options({}))
    assert [(d.kind, registry.width(d)) for d in default.drafts] == [("prompt-lookup", 7)]
    tuned = validate_bench(
        build_options("bench", {"prompt_lookup_max_draft": 3, "max_tokens": 64}), build_bench_options({})
    )
    assert [(d.kind, registry.width(d)) for d in tuned.drafts] == [("prompt-lookup", 3)]


def test_spec_type_none_turns_speculation_off_and_draft_simple_maps_to_full_model():
    from mlxcel_py.commands._options import build_options
    from mlxcel_py.validate import validate

    off = validate(build_options("serve", {"spec_type": "none", "draft_model": "d"}))
    assert not off.draft.enabled
    simple = validate(build_options("serve", {"spec_type": "draft-simple", "draft_model": "d"}))
    assert simple.draft.kind == "full-model" and simple.draft.block_size == 4
    pl = validate(build_options("serve", {"draft_kind": "prompt-lookup", "draft_block_size": 5}))
    assert pl.draft.kind == "prompt-lookup" and pl.draft.lookup.max_draft == 5
    g = validate(build_options("generate", {"prompt": "x", "prompt_lookup": True}))
    assert (g.draft.lookup.ngram_min, g.draft.lookup.ngram_max, g.draft.lookup.max_draft) == (2, 3, 7)
    auto = validate(build_options("generate", {"prompt": "x", "draft_model": "d"}))
    assert auto.draft.kind == "full-model" and not auto.draft.kind_explicit  # an MTP checkpoint turns it to mtp
    mtp = validate(build_options("serve", {"spec_type": "draft-mtp"}))
    assert (mtp.draft.kind, mtp.draft.block_size, mtp.draft.block_explicit) == ("mtp", 4, False)
    wide = validate(build_options("generate", {"prompt": "x", "draft_kind": "mtp", "draft_block_size": 2}))
    assert (wide.draft.block_size, wide.draft.block_explicit, wide.draft.draft_model) == (2, True, None)


def test_seed_minus_one_is_random_and_spec_type_none_warns_about_a_dropped_drafter():
    from mlxcel_py.commands._options import build_options
    from mlxcel_py.validate import validate

    assert validate(build_options("generate", {"prompt": "x", "seed": -1})).options.sampling.seed is None
    assert validate(build_options("generate", {"prompt": "x", "seed": 7})).options.sampling.seed == 7
    off = validate(build_options("serve", {"spec_type": "none", "draft_model": "small"}))
    assert not off.draft.enabled
    assert off.warnings == ("--spec-type none: the drafter small is dropped; decoding plainly",)
    assert validate(build_options("serve", {"spec_type": "none"})).warnings == ()


def test_bench_has_no_r_short_flag_and_its_max_tokens_help_says_at_least_1(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["bench", "-r", "2"])
    assert r.exit_code == 2 and "No such option" in r.output
    help_text = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).output
    assert "at least 1" in help_text and "until EOS" not in help_text


def test_bench_vs_llama_cpp_without_the_package_is_refused(no_loading, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["bench", "--vs", "llama.cpp"])
    assert result.exit_code == 2
    assert "--vs llama.cpp needs llama-cpp-python, which is not installed" in result.stderr
    assert "pip install -e '.[llama]'" in result.stderr
    assert no_loading == []


def test_serve_takes_llama_server_command_lines(monkeypatch, no_loading, tmp_path):
    """llama-server spellings parse with its meanings; GPU-only flags are accepted with a note."""
    from mlxcel_py.server import main as server_main

    seen = []
    monkeypatch.setattr(server_main, "run_server", lambda cfg, **kw: seen.append(cfg))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    argv = [
        "serve",
        "-np",
        "2",
        "-ngl",
        "99",
        "-fa",
        "on",
        "-cb",
        "-ctk",
        "f16",
        "-ctv",
        "f32",
        "-c",
        "256",
        "-n",
        "64",
        "-t",
        "1",
        "--temp",
        "0.7",
        "-kvu",
        "--api-key",
        "a,b",
        "--api-key",
        "c",
        "--cors-origins",
        "https://x.example, https://y.example",
        "--log-disable",
        "-b",
        "2048",
        "-ub",
        "512",
        "--metrics",
        "--no-cache-idle-slots",
        "--draft-min",
        "3",
        "--draft-max",
        "8",
        "--draft-kind",
        "prompt-lookup",
    ]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    srv = seen[0].options.server
    assert (srv.parallel, srv.ctx_size, srv.threads, srv.kv_unified, srv.log_disable) == (2, 256, 1, True, True)
    assert srv.metrics  # /metrics answers (501 without)
    assert seen[0].options.generation.max_tokens == 64 and seen[0].options.sampling.temp == 0.7
    assert srv.api_keys == ("a,b", "c") and srv.cors_origins == "https://x.example, https://y.example"
    assert set(srv.ignored) == {"--n-gpu-layers", "--flash-attn", "--batch-size", "--ubatch-size"}
    assert seen[0].options.model.cache_types == ("f16", "f32")  # -ctk/-ctv take effect (models/kv_cache.py)
    assert seen[0].draft.min_draft == 3  # --draft-min takes effect (engine/generation.py)
    warnings = seen[0].warnings
    assert "--n-gpu-layers is a llama.cpp setting that does not apply to MLX; ignored" in warnings
    assert not any(f in w for w in warnings for f in ("--parallel", "--cont-batching", "--metrics", "--draft-min"))
    import os

    assert os.environ.get("OPENBLAS_NUM_THREADS") == "1"
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    # -t is threads on serve (llama-server's meaning): a temperature there is a usage error naming it
    result = CliRunner().invoke(app, ["serve", "-t", "0.7"])
    assert result.exit_code == 2 and "-t" in result.output
    assert no_loading == []


@pytest.mark.parametrize(
    "argv,message",
    [
        (["serve", "-c", "-1"], "--ctx-size must be 0 (the model's window) or a positive number of tokens"),
        (["serve", "-np", "300"], "--parallel (-np) must be between 1 and 256"),
        (["serve", "-t", "0"], "--threads (-t) must be at least 1"),
        (["serve", "--context-shift", "--keep", "-2"], "--keep must be -1 (the whole prompt) or 0 or more tokens"),
        (["serve", "--slot-save-path", "/nonexistent-slots"], "--slot-save-path /nonexistent-slots: no such folder"),
        (["serve", "--models-dir", "/nonexistent-models"], "--models-dir /nonexistent-models: no such folder"),
        (["serve", "--models-preset", "/nonexistent.ini"], "--models-preset /nonexistent.ini: no such file"),
        (["serve", "--embeddings", "--pooling", "max"], "--pooling max is not one of none, mean, cls, last, rank"),
        (["serve", "--prompt-lookup-max-batch", "many"], "--prompt-lookup-max-batch takes a count or auto, got 'many'"),
    ],
)
def test_serve_flag_ranges(argv, message, no_loading, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and message in result.stderr


def test_an_explicit_np_splits_the_window_as_llama_server_and_kvu_or_the_default_do_not():
    from mlxcel_py.options import ServerOptions
    from mlxcel_py.session import context_window

    assert ServerOptions(parallel=4, parallel_given=True).slot_context(8192) == 2048
    assert ServerOptions(parallel=4, parallel_given=True, kv_unified=True).slot_context(8192) == 8192
    assert ServerOptions(parallel=4).slot_context(8192) == 8192  # the default slot count
    run = SimpleNamespace(options=SimpleNamespace(server=ServerOptions(parallel=2, parallel_given=True, ctx_size=512)))
    assert context_window(run, 8192) == 256  # llama-server's n_ctx // n_slots (its test_context_size_exceeded)
    assert context_window(run, 8192, world=object()) == 512  # one slot under --tp-size/--pp-size


@pytest.mark.parametrize("value", ["-1", "65"])
def test_draft_min_out_of_range_is_refused_before_loading(value, no_loading):
    result = CliRunner().invoke(app, ["generate", "-p", "x", "--prompt-lookup", "--draft-min", value])
    assert result.exit_code == 2
    assert f"--draft-min must be between 0 and 64, got {value}" in result.output
    assert no_loading == []


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_draft_acceptance_names_a_rule_before_loading(command, no_loading):
    args = [command, "--draft-model", "d", "--draft-acceptance", "p/q"] + (["-p", "x"] if command == "generate" else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--draft-acceptance 'p/q' is not one of: sampler-match, p-q" in result.output
    assert no_loading == []


def test_offline_refuses_a_repo_id_not_in_the_cache_without_the_network(tmp_path, monkeypatch):
    """llama.cpp's --offline: a repo id not in the Hugging Face cache is a one-line error (exit 1),
    with no download tried (the hub's address is unreachable here: a try would fail otherwise)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # recorded, so the flag's "1" is undone after the test
    result = CliRunner().invoke(app, ["generate", "-m", "someorg/not-cached", "--offline", "-p", "hi"])
    assert result.exit_code == 1
    assert "not in the local Hugging Face cache, and --offline (HF_HUB_OFFLINE) forbids downloading it" in result.output
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"  # what the flag set, for huggingface_hub too


@pytest.mark.parametrize("value,want", [(None, 2), ("auto", None), ("AUTO", None), ("5", 5)])
def test_prompt_lookup_max_batch_is_a_count_or_auto(value, want):
    """The seed's count (default 2) caps the measured cost gate; auto leaves the cost alone (engine.gate)."""
    from mlxcel_py.commands._options import build_options

    params = {} if value is None else {"prompt_lookup_max_batch": value}
    from mlxcel_py.validate import validate

    cfg = validate(build_options("serve", params))
    assert cfg.options.server.prompt_lookup_max_batch == want

"""`mlxcel generate` end to end in a subprocess: stdout clean, errors one line, real model."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import mlxcel_cmd


def mlxcel(args, env, input=None, timeout=300, cwd=None):
    return subprocess.run(
        mlxcel_cmd() + args, capture_output=True, text=True, env=env, input=input, timeout=timeout, cwd=cwd
    )


def test_help_lists_documented_flags_for_all_commands(cli_env):
    common = [
        "--model",
        "--draft-model",
        "--max-tokens",
        "--profile",
        "--no-chat-template",
        "--system",
        "--stop",
        "--ignore-eos",
        "--min-tokens",
        "--image",
        "--audio",
        "--video",
        "--temp",
        "--top-p",
        "--top-k",
        "--min-p",
        "--seed",
        "--repetition-penalty",
        "--repeat-last-n",
        "--draft-kind",
        "--draft-block-size",
        "--spec-type",
        "--pp-size",
        "--revision",
        "--no-blas",
        "--no-dequantize",
        "--no-fast-kernels",
        "--suffix-cache-tokens",
        "--suffix-store",
    ]
    lookup = [
        "--prompt-lookup",
        "--prompt-lookup-ngram-max",
        "--prompt-lookup-ngram-min",
        "--prompt-lookup-max-draft",
        "--prompt-lookup-no-adaptive",
        "--prompt-lookup-policy",
    ]
    server = ["--host", "--port", "--prompt-lookup-max-batch", "--no-batch", "--kv-unified"]
    for cmd, extra in [
        ("generate", ["--prompt"] + lookup),
        ("run", ["--prompt"]),
        ("chat", ["--prompt"]),
        ("serve", server),
    ]:
        r = mlxcel([cmd, "--help"], {**cli_env, "COLUMNS": "200"})
        assert r.returncode == 0
        flags = (
            common
            if cmd != "serve"
            else [
                f
                for f in common
                if f
                not in (
                    "--profile",
                    "--no-chat-template",
                    "--system",
                    "--stop",
                    "--ignore-eos",
                    "--min-tokens",
                    "--image",
                    "--audio",
                    "--video",
                )
            ]
        )
        for flag in flags + extra:
            assert flag in r.stdout, (cmd, flag)
        if cmd != "generate":  # refused there, so not listed (still parsed, so the refusal names them)
            assert not re.search(r"--prompt-lookup(?!-max-batch)", r.stdout), cmd
    r = mlxcel(["bench", "--help"], {**cli_env, "COLUMNS": "200"})
    assert r.returncode == 0
    for flag in [
        "--model",
        "--draft-model",
        "--max-tokens",
        "--temp",
        "--seed",
        "--draft-kind",
        "--draft-block-size",
        "--prompt-lookup",
        "--prompt-lookup-max-draft",
        "--prompt-lookup-policy",
        "--workload",
        "--sweep-widths",
        "--plot",
        "--vs",
        "--json",
        "--markdown",
        "--limit",
        "--repeats",
        "--no-blas",
        "--trace",
        "--suffix-cache-tokens",
    ]:
        assert flag in r.stdout, ("bench", flag)
    r = mlxcel(["chat", "--prompt-lookup-policy", "cost"], cli_env)
    assert r.returncode == 2 and "--prompt-lookup-policy" in r.stderr


def test_help_shows_every_flag_name_whole_at_80_columns(monkeypatch):
    import typer.main
    from typer.testing import CliRunner

    from mlxcel_py.cli import app

    monkeypatch.setenv("COLUMNS", "80")
    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        if cmd.hidden:
            continue
        out = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"}).output
        assert "\u2026" not in out, name  # rich's ellipsis
        assert max(len(line) for line in out.splitlines()) <= 80, name
        for param in cmd.params:
            if getattr(param, "hidden", False) or param.param_type_name != "option":
                continue
            for opt in param.opts + param.secondary_opts:
                assert re.search(rf"(^|[\s,]){re.escape(opt)}([\s,]|$)", out, re.M), (name, opt)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["-m", "/nonexistent/model"], "no such file or folder"),
        (["-m", "{empty}"], "no config.json in this folder"),
        (["-m", "{badjson}"], "malformed JSON"),
        (["-m", "{badgguf}"], "GGUF architecture 'gpt2' is not supported"),
        (["-m", "someone/not-cached-model"], "not in the local Hugging Face cache"),
        (["--max-tokens", "-5"], "--max-tokens must be -1"),
        (["--temp", "-1"], "--temp must be >= 0"),
    ],
)
def test_bad_inputs_one_line_error(args, fragment, cli_env, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    gg = tmp_path / "m.gguf"
    _write_gguf(gg, arch="gpt2")
    args = [a.format(empty=empty, badjson=bad, badgguf=gg) for a in args]
    r = mlxcel(["generate", "-p", "hello", "-n", "4"] + args, cli_env)
    assert r.returncode in (1, 2)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], r.stderr


def _write_gguf(path, arch):
    import mlx.core as mx

    mx.save_gguf(str(path), {"token_embd.weight": mx.zeros((4, 4))}, {"general.architecture": arch})


@pytest.mark.real
def test_pipeline_stdout_is_only_the_completion(cli_env):
    r = subprocess.run(
        " ".join(mlxcel_cmd()) + " generate -p - --prompt-lookup -n 24 | wc -w",
        shell=True,
        capture_output=True,
        text=True,
        env=cli_env,
        input="Fix: teh cat\n",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) > 0
    assert "[Prompt lookup] rounds=" in r.stderr


@pytest.mark.real
def test_profile_and_summary_go_to_stderr(cli_env, workloads):
    prompt = workloads[0]["prompt"]
    r = mlxcel(["generate", "-p", prompt, "--prompt-lookup", "--profile", "-n", "48", "--verbose"], cli_env)
    assert r.returncode == 0, r.stderr
    for key in (
        "Prompt tokens",
        "Generated tokens",
        "Prefill",
        "Decode",
        "TTFT",
        "Peak memory",
        "BLAS",
        "Weights",
        "Rounds",
        "Drafted rounds",
        "Paused rounds",
        "Proposed",
        "Accepted",
        "Acceptance rate",
        "Mean accepted prefix",
        "Tokens per forward",
        "Draft",
        "Verify",
        "Rollback",
    ):
        assert key in r.stderr, key
    assert "[Prompt lookup] rounds=" in r.stderr
    assert "Profile" not in r.stdout and "[Generated" not in r.stdout
    from mlxcel_py.cpu import extension as cpu_extension

    assert "openblas" in r.stderr
    qmm, why = cpu_extension.kernel_status()
    # the build in use (AVX-512 VNNI or AVX2), as --verbose names it, or float32
    assert (why.split(",")[0] if qmm is not None else "f32") in r.stderr
    assert qmm is None or re.search(r"row-exact (AVX-512 VNNI|AVX2) kernel", r.stderr)


@pytest.mark.real
def test_generate_greedy_equals_mlx_lm_generate(cli_env, real):
    """Token for token against stock mlx-lm on the same weights (quantized, as stored)."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tok = mlx_lm.load(str(real.resolved.path))
    for text in ["List three prime numbers and explain why."]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ref = mlx_lm.generate(model, tok, ids, max_tokens=24, sampler=make_sampler(0.0))
        # with mlx-lm's kernels, and with our vectorized-exp ones (about 1 ulp from MLX's exp)
        for kernels in ([], ["--no-fast-kernels"]):
            r = mlxcel(["generate", "-p", text, "-n", "24", "--no-dequantize", *kernels], cli_env)
            assert r.returncode == 0, r.stderr
            assert r.stdout.rstrip("\n") == ref.rstrip("\n"), kernels


@pytest.mark.real
def test_stop_string_ends_output_before_it(cli_env):
    r = mlxcel(["generate", "-p", "Count from 1 to 20, separated by commas.", "-n", "60", "--stop", "7"], cli_env)
    assert r.returncode == 0, r.stderr
    assert "7" not in r.stdout and "6" in r.stdout


def _cache_snapshot(hub: Path, repo: str, source: Path) -> None:
    """A model in the Hugging Face cache layout (models--org--name/snapshots/REV + refs/main)."""
    import shutil

    base = hub / ("models--" + repo.replace("/", "--"))
    shutil.copytree(source, base / "snapshots" / "0123abc")
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("0123abc")


def test_run_resolves_a_bare_name_in_the_default_org(tmp_path, tiny_dir, cli_env):
    hub = tmp_path / "hub"
    _cache_snapshot(hub, "mlx-community/tiny-llama", tiny_dir)
    _cache_snapshot(hub, "my-org/tiny-llama", tiny_dir)
    env = {**cli_env, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    r = mlxcel(["run", "tiny-llama", "-p", "hi", "-n", "3", "--no-chat-template", "-v"], env)
    assert r.returncode == 0, r.stderr
    assert "mlx-community/tiny-llama" in r.stderr
    r = mlxcel(
        ["run", "tiny-llama", "-p", "hi", "-n", "3", "--no-chat-template", "-v"],
        {**env, "MLXCEL_DEFAULT_ORG": "my-org"},
    )
    assert r.returncode == 0 and "my-org/tiny-llama" in r.stderr
    r = mlxcel(["run", "no-such-model", "-p", "hi"], env)
    assert r.returncode == 1
    assert (
        "error: --model no-such-model (read as mlx-community/no-such-model; set MLXCEL_DEFAULT_ORG for "
        "another organisation): not in the local Hugging Face cache"
    ) in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("with_prompt", [True, False])
def test_a_closed_stdin_still_works(tiny_dir, cli_env, with_prompt):
    """`cmd <&-` (daemons, subprocess callers): the weights used to open as fd 0 and fail to load,
    and without -p sys.stdin was None (an AttributeError traceback)."""
    import shlex

    args = mlxcel_cmd() + ["generate", "-m", str(tiny_dir), "-n", "4"] + (["-p", "hi"] if with_prompt else [])
    r = subprocess.run(
        ["bash", "-c", shlex.join(args) + " <&-"], capture_output=True, text=True, env=cli_env, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Failed to open" not in r.stderr
    if with_prompt:
        assert r.stdout.strip()  # four generated tokens


def test_invalid_utf8_in_the_prompt_is_replaced_with_a_warning(tiny_dir, cli_env):
    bad = b"Fix: teh \xff\xfe cat"
    for args, stdin in ((["-p", os.fsdecode(bad)], None), (["-p", "-"], bad)):
        r = subprocess.run(
            mlxcel_cmd() + ["generate", "-m", str(tiny_dir), "-n", "4", *args],
            input=stdin,
            capture_output=True,
            env=cli_env,
            timeout=300,
        )
        err = r.stderr.decode()
        assert r.returncode == 0, err
        assert "invalid UTF-8 replaced" in err and "Traceback" not in err


def test_an_unusable_cache_folder_or_a_config_folder_is_one_line(cli_env, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for cache in (str(blocker / "cache"), "/proc/no-such-cache"):  # under a file; unwritable
        r = subprocess.run(
            mlxcel_cmd() + ["generate", "-p", "hi", "-n", "2"],
            capture_output=True,
            text=True,
            env={**cli_env, "MLXCEL_CACHE_DIR": cache},
            timeout=300,
        )
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"cache folder {cache}: cannot write" in r.stderr and "MLXCEL_CACHE_DIR" in r.stderr
        assert len(r.stderr.strip().splitlines()) <= 2
    r = subprocess.run(
        mlxcel_cmd() + ["--config", str(tmp_path), "generate", "-p", "hi"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert r.returncode == 2 and f"--config {tmp_path}: is a folder" in r.stderr and "Traceback" not in r.stderr


def test_a_huge_stdin_prompt_is_refused_by_size_before_it_is_tokenized(tiny_dir, cli_env):
    """A 50 MB stdin prompt was read whole and tokenized (48 s, 6 GB) before being refused."""
    base = mlxcel_cmd() + ["generate", "-m", str(tiny_dir), "-n", "4", "-p", "-"]
    # past the read limit: refused as a usage error, without reading on (or loading the model)
    r = subprocess.run(base, input=b"x" * (17 * 2**20), capture_output=True, env=cli_env, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 2 and "-p -: standard input holds more than 16777216 characters" in err, err
    # under it but over what the window holds in any tokenization: refused before tokenizing (the
    # message counts characters; a tokenized prompt's counts tokens)
    r = subprocess.run(base, input=b"word " * 400_000, capture_output=True, env=cli_env, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 1 and "the prompt has 2000000 characters, more than the model's context" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "change,fragment",
    [
        ({"num_hidden_layers": 10**9}, "'num_hidden_layers' must be a whole number from 1 to 4096, got 1000000000"),
        ({"num_hidden_layers": "many"}, "'num_hidden_layers' must be a whole number from 1 to 4096, got 'many'"),
        ({"num_hidden_layers": 0}, "'num_hidden_layers' must be a whole number from 1 to 4096, got 0"),
        ({"num_hidden_layers": -1}, "got -1"),
        ({"hidden_size": True}, "'hidden_size' must be a whole number"),
        ({"vocab_size": 2.5}, "'vocab_size' must be a whole number"),
        ({"text_config": {"num_attention_heads": -4}}, "'text_config.num_attention_heads' must be"),
    ],
)
def test_a_config_with_insane_sizes_is_one_line_before_anything_is_built(tiny_dir, change, fragment, cli_env, tmp_path):
    import json
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    r = mlxcel(["generate", "-p", "hello", "-n", "4", "-m", str(folder)], cli_env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0] and "config.json" in errors[0], r.stderr


def test_a_fifo_or_a_looping_link_as_the_model_is_named_for_what_it_is(cli_env, tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    (tmp_path / "owner").mkdir()
    os.symlink("name", tmp_path / "owner" / "name")  # owner/name: a looping link, not a repo id
    for model, fragment in (
        ("fifo", "not a folder or a regular file (a FIFO or a device)"),
        ("a", "a symbolic link that leads to no file or folder"),
        ("owner/name", "a symbolic link that leads to no file or folder"),
    ):
        r = subprocess.run(
            mlxcel_cmd() + ["generate", "-p", "hello", "-n", "4", "-m", model],
            capture_output=True,
            text=True,
            env=cli_env,
            cwd=tmp_path,
            timeout=300,
        )
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert fragment in r.stderr and "Hugging Face" not in r.stderr, r.stderr


def test_llama_cpp_underscore_spellings_of_a_commands_flags(tiny_dir, cli_env):
    """llama.cpp reads `--max_tokens` as `--max-tokens`; so does every command here (and
    mlxcel-server), for its own flags only: an unknown underscored flag is still an error."""
    from mlxcel_py.commands._spelling import respell

    flags = {"--max-tokens", "--prompt-lookup", "--temp"}
    assert respell(["--max_tokens", "3", "--prompt_lookup", "--temp=0.5", "-p", "--x_y", "--a_b=c"], flags) == [
        "--max-tokens", "3", "--prompt-lookup", "--temp=0.5", "-p", "--x_y", "--a_b=c",
    ]  # fmt: skip
    base = mlxcel_cmd() + ["generate", "-m", str(tiny_dir), "-p", "Hi"]
    dashed = subprocess.run(
        base + ["--max-tokens", "3", "--prompt-lookup"], capture_output=True, text=True, env=cli_env
    )
    under = subprocess.run(base + ["--max_tokens", "3", "--prompt_lookup"], capture_output=True, text=True, env=cli_env)
    assert under.returncode == 0 and under.stdout == dashed.stdout and dashed.stdout
    bad = subprocess.run(base + ["--no_such_flag"], capture_output=True, text=True, env=cli_env)
    assert bad.returncode == 2 and "--no_such_flag" in bad.stderr

"""scripts/llama_cpp_suite.py, the stand-in that runs llama.cpp's server test suite against
`mlxcel serve`: it drops only what names a reference model or a feature mlxcel-py lacks, and every
other flag the suite's utils.py passes to llama-server parses as `mlxcel serve`'s own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from typer.testing import CliRunner

from mlxcel_py.cli import app

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "llama_cpp_suite.py"


def suite_module():
    spec = importlib.util.spec_from_file_location("llama_cpp_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# every flag llama.cpp's tools/server/tests/utils.py (ServerProcess.start) may pass, with a value
SUITE_FLAGS = [
    "--host", "127.0.0.1", "--port", "8080", "--temp", "0.8", "--seed", "42", "--offline",
    "--model", "stories260K.gguf", "--model-draft", "draft.gguf", "--hf-repo", "ggml-org/models",
    "--hf-file", "x.gguf", "--batch-size", "1024", "--ubatch-size", "512", "--threads", "2",
    "--n-gpu-layers", "99", "--draft", "8", "--cont-batching", "--embedding", "--metrics", "--kv-unified",
    "--slots", "--pooling", "mean", "--alias", "tinyllama-2,x", "--tags", "a,b", "--ctx-size", "512",
    "--parallel", "2", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "--n-predict", "64",
    "--slot-save-path", "/tmp", "--grp-attn-n", "2", "--grp-attn-w", "16", "--verbose", "--lora", "l.gguf",
    "--context-shift", "--api-key", "k", "--draft-max", "8", "--draft-min", "2", "--no-webui", "--jinja",
    "--reasoning-format", "deepseek", "--reasoning", "off", "--chat-template", "chatml",
    "--sleep-idle-seconds", "5", "--webui-mcp-proxy", "--spec-type", "draft-simple", "--spec-draft-n-max", "8",
    "--spec-draft-n-min", "2",
]  # fmt: skip
# --model-draft is kept: the script links the suite's draft file to the stand-in model
DROPPED_HERE = {"--model", "--hf-repo", "--hf-file",
                "--grp-attn-n", "--grp-attn-w", "--lora"}  # fmt: skip


def test_reference_model_flags_are_dropped_with_their_values_and_the_rest_passed_on():
    argv = suite_module().server_argv(SUITE_FLAGS, "mlxcel")
    assert argv[:2] == ["mlxcel", "serve"]
    kept = argv[2:]
    assert not DROPPED_HERE & set(kept)
    assert "stories260K.gguf" not in kept and "l.gguf" not in kept
    for flag in (
        "--offline",
        "--metrics",
        "--batch-size",
        "--ubatch-size",
        "--draft-min",
        "--draft",
        "--model-draft",
        "--spec-draft-n-max",
        "--spec-draft-n-min",
        "--no-webui",
        "--context-shift",
        "--slot-save-path",
        "--embedding",
        "--pooling",
        "--sleep-idle-seconds",
        "--webui-mcp-proxy",
    ):
        assert flag in kept


def test_every_flag_the_suite_passes_on_parses_as_mlxcel_serve(monkeypatch, tmp_path):
    from mlxcel_py.server import main as server_main

    seen = []
    monkeypatch.setattr(server_main, "run_server", lambda cfg, **kw: seen.append(cfg))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # --offline sets it; restored after the test
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    argv = suite_module().server_argv(SUITE_FLAGS, "mlxcel")
    result = CliRunner().invoke(app, argv[1:])
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("MLXCEL_KERNEL_THREADS", raising=False)
    assert result.exit_code == 0, result.output
    cfg = seen[0]
    assert cfg.draft.min_draft == 2 and cfg.options.server.parallel == 2 and not cfg.options.server.webui

"""--adapter-path / --lora: an mlx-lm LoRA adapter fused into the weights at load. The text equals
the text of the model `mlx_lm.fuse` writes from the same adapter (float and 4-bit bases), differs
from the base model's, and speculation on the adapted model still equals its plain decoding.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import make_tiny_model, mlxcel_cmd, write_byte_tokenizer

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"
LORA = {"rank": 4, "scale": 4.0, "dropout": 0.0}


def _base(folder: Path, quantized: bool) -> Path:
    make_tiny_model(folder, seed=5, scale=2.5)
    if quantized:
        from mlx_lm.utils import load, quantize_model, save_config, save_model

        model, _ = load(str(folder))
        model, config = quantize_model(model, json.loads((folder / "config.json").read_text()), 32, 4)
        save_model(folder, model)
        save_config(config, folder / "config.json")
    return folder


def _adapter(base: Path, folder: Path) -> Path:
    """A LoRA adapter as mlx_lm.lora writes one, with random (non-zero) B so it changes the text."""
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load

    model, _ = load(str(base))
    model.freeze()
    linear_to_lora_layers(model, 2, LORA)
    mx.random.seed(11)
    trained = tree_map(lambda p: mx.random.normal(p.shape) * 0.5, model.trainable_parameters())
    model.update(trained)
    folder.mkdir(parents=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), dict(tree_flatten(model.trainable_parameters())))
    cfg = {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": LORA}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def _fused_by_mlx_lm(base: Path, adapter: Path, folder: Path) -> Path:
    """What `mlx_lm.fuse` writes (its default: a quantized layer is quantized again)."""
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import load, save_config, save_model

    model, _ = load(str(base), adapter_path=str(adapter))
    fused = [(n, m.fuse(dequantize=False)) for n, m in model.named_modules() if hasattr(m, "fuse")]
    model.update_modules(tree_unflatten(fused))
    folder.mkdir(parents=True)
    save_model(folder, model)
    save_config(json.loads((base / "config.json").read_text()), folder / "config.json")
    write_byte_tokenizer(folder)
    return folder


def _gen(env, model: Path, *extra: str) -> str:
    args = ["generate", "-m", str(model), "-p", PROMPT, "--no-chat-template", "-n", "40", "--temp", "0", *extra]
    r = subprocess.run(mlxcel_cmd() + args, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "4-bit"])
def test_an_adapted_model_speaks_as_mlx_lms_fused_model(tmp_path, cli_env, quantized):
    base = _base(tmp_path / "base", quantized)
    adapter = _adapter(base, tmp_path / "adapter")
    fused = _fused_by_mlx_lm(base, adapter, tmp_path / "fused")
    adapted = _gen(cli_env, base, "--adapter-path", str(adapter))
    assert adapted == _gen(cli_env, fused)
    assert adapted != _gen(cli_env, base)  # the adapter changes what the model says
    assert _gen(cli_env, base, "--lora", str(adapter), "--prompt-lookup") == adapted  # llama-server's name too


def test_an_adapter_of_another_model_is_refused_in_one_line(tmp_path, cli_env):
    base = _base(tmp_path / "base", False)
    other = make_tiny_model(tmp_path / "other", seed=6, hidden=32)
    adapter = _adapter(other, tmp_path / "adapter")
    r = subprocess.run(
        mlxcel_cmd() + ["generate", "-m", str(base), "-p", "x", "--adapter-path", str(adapter)],
        capture_output=True,
        text=True,
        env=cli_env,
    )
    assert r.returncode == 1 and "does not fit this model" in r.stderr and "Traceback" not in r.stderr


def test_folder_checks_before_loading(tmp_path, cli_env):
    gguf = tmp_path / "lora.gguf"
    gguf.write_bytes(b"GGUF")
    half = tmp_path / "half"
    half.mkdir()
    (half / "adapter_config.json").write_text("{}")
    for path, message in (
        (gguf, "llama.cpp's GGUF LoRA adapters are not read here"),
        (tmp_path / "none", "no such folder"),
        (half, "no adapters.safetensors in it"),
    ):
        r = subprocess.run(
            mlxcel_cmd() + ["generate", "-p", "x", "--adapter-path", str(path)],
            capture_output=True,
            text=True,
            env=cli_env,
        )
        assert r.returncode == 2 and message in r.stderr
    shutil.rmtree(half)


def test_lora_adapters_lists_the_fused_adapter_and_refuses_new_scales():
    from test_server_requests import make_client

    client, _ = make_client()
    assert client.get("/lora-adapters").json() == []
    client.app.state.ctx.adapter = "/adapters/style"
    assert client.get("/lora-adapters").json() == [{"id": 0, "path": "/adapters/style", "scale": 1.0}]
    r = client.post("/lora-adapters", json=[{"id": 0, "scale": 0.5}])
    assert r.status_code == 400 and "fuses the adapter into the weights" in r.json()["error"]["message"]

"""--adapter-path / --lora / --lora-scaled: adapters fused into the weights at load. An mlx-lm
adapter's text equals the text of the model `mlx_lm.fuse` writes from it (float and 4-bit bases;
a 4-bit layer fused at 8 bits),
differs from the base model's, and speculation on the adapted model still equals its plain
decoding. A GGUF LoRA adapter (llama.cpp's layout, Q/K rows in its rotary order) speaks as the
same pairs in an mlx-lm folder; scales, several adapters and a scale of 0 (the base model exactly).
The server's per-request `lora`, POST /lora-adapters and their prompt caches are in
test_adapter_serving.py.
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
    """What `mlx_lm.fuse` writes, its fused float layers quantized at 8 bits where the base's
    were quantized (a second 4-bit rounding drowns the delta: adapters.fused_bits)."""
    import mlx.nn as nn
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import load, save_config, save_model

    model, _ = load(str(base), adapter_path=str(adapter))
    fused = []
    for n, m in model.named_modules():
        if hasattr(m, "fuse"):
            f = m.fuse(dequantize=True)
            if isinstance(m.linear, nn.QuantizedLinear):
                f = nn.QuantizedLinear.from_linear(f, m.linear.group_size, 8)
            fused.append((n, f))
    model.update_modules(tree_unflatten(fused))
    folder.mkdir(parents=True)
    save_model(folder, model)
    save_config(json.loads((base / "config.json").read_text()), folder / "config.json")
    write_byte_tokenizer(folder)
    return folder


def _gen(env, model: Path, *extra: str, chat: bool = False) -> str:
    """Greedy text of 40 tokens after PROMPT (`chat`: as a user turn through the chat template)."""
    template = [] if chat else ["--no-chat-template"]
    args = ["generate", "-m", str(model), "-p", PROMPT, *template, "-n", "40", "--temp", "0", *extra]
    r = subprocess.run(mlxcel_cmd() + args, capture_output=True, env=env)  # bytes: a "\r" stays a "\r"
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode()


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


def test_flag_checks_before_loading(tmp_path, cli_env):
    half = tmp_path / "half"
    half.mkdir()
    (half / "adapter_config.json").write_text("{}")
    for flag, path, message in (
        ("--adapter-path", str(tmp_path / "none"), "no such folder or .gguf file"),
        ("--adapter-path", str(half), "no adapters.safetensors in it"),
        ("--lora", str(tmp_path / "none.gguf"), "no such file"),
        ("--lora-scaled", f"{tmp_path / 'a.gguf'}:half", "expected FNAME:SCALE"),
        ("--lora-scaled", f"{tmp_path / 'a.gguf'}", "expected FNAME:SCALE"),
    ):
        r = subprocess.run(
            mlxcel_cmd() + ["generate", "-p", "x", flag, path],
            capture_output=True,
            text=True,
            env=cli_env,
        )
        assert r.returncode == 2 and message in r.stderr, (flag, path, r.stderr)
        assert flag in r.stderr and "Traceback" not in r.stderr
    shutil.rmtree(half)


def test_a_file_that_is_no_gguf_adapter_is_refused_in_one_line(tmp_path, cli_env):
    import gguf_files
    from gguf import GGMLQuantizationType as Q

    base = tmp_path / "base.gguf"
    gguf_files.write(base, "llama", [Q.F16])
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF")
    for adapter, message in ((base, "not a GGUF LoRA adapter"), (broken, "cannot read as GGUF")):
        r = subprocess.run(
            mlxcel_cmd() + ["generate", "-m", str(base), "-p", "x", "--lora", str(adapter)],
            capture_output=True,
            text=True,
            env=cli_env,
        )
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---- GGUF LoRA adapters ----------------------------------------------------------------------
RANK, ALPHA = 4, 8.0  # scale alpha / rank = 2, exact in float32
ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj")


def _pairs(cfg: dict, seed: int) -> dict:
    """Random (A [rank, in], B [out, rank]) for the attention projections of every layer."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h, d = cfg["hidden_size"], cfg["head_dim"]
    outs = {"q_proj": cfg["num_attention_heads"] * d, "k_proj": cfg["num_key_value_heads"] * d}
    outs |= {"v_proj": cfg["num_key_value_heads"] * d, "o_proj": h}
    ins = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": cfg["num_attention_heads"] * d}
    return {
        f"model.layers.{i}.self_attn.{p}.weight": (
            rng.normal(0, 0.3, (RANK, ins[p])).astype(np.float32),
            rng.normal(0, 0.3, (outs[p], RANK)).astype(np.float32),
        )
        for i in range(cfg["num_hidden_layers"])
        for p in ADAPTED
    }


def _as_folder(pairs: dict, folder: Path) -> Path:
    """The same pairs as an mlx_lm.lora folder: lora_a [in, rank], lora_b [rank, out], scale alpha / rank."""
    folder.mkdir(parents=True)
    tensors = {}
    for name, (a, b) in pairs.items():
        module = name.removesuffix(".weight")
        tensors[f"{module}.lora_a"] = mx.array(a.T.copy())
        tensors[f"{module}.lora_b"] = mx.array(b.T.copy())
    mx.save_safetensors(str(folder / "adapters.safetensors"), tensors)
    params = {"rank": RANK, "scale": ALPHA / RANK, "dropout": 0.0, "keys": [f"self_attn.{p}" for p in ADAPTED]}
    cfg = {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": params}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    """A tiny llama GGUF (8-bit and half-precision layers) and two GGUF LoRA adapters for it."""
    import gguf_files
    from gguf import GGMLQuantizationType as Q

    root = tmp_path_factory.mktemp("gguf-lora")
    cfg, _, _ = gguf_files.write(root / "base.gguf", "llama", [Q.Q8_0, Q.F16])
    first, second = _pairs(cfg, 1), _pairs(cfg, 2)
    return {
        "base": root / "base.gguf",
        "a": gguf_files.write_lora(root / "a.gguf", "llama", first, ALPHA, task_name="style"),
        "b": gguf_files.write_lora(root / "b.gguf", "llama", second, ALPHA),
        "a_folder": _as_folder(first, root / "a-folder"),
    }


def test_a_gguf_lora_speaks_as_the_same_pairs_in_an_mlx_lm_folder(gguf_pair, cli_env):
    base = gguf_pair["base"]
    adapted = _gen(cli_env, base, "--lora", str(gguf_pair["a"]))
    # the Q/K rows put back in the model's order (a wrong order gives other text), alpha / rank applied
    assert adapted == _gen(cli_env, base, "--lora", str(gguf_pair["a_folder"]))
    assert adapted != _gen(cli_env, base)
    assert _gen(cli_env, base, "--lora", str(gguf_pair["a"]), "--prompt-lookup") == adapted


def test_scales_and_several_adapters(gguf_pair, cli_env):
    base, a, b = gguf_pair["base"], str(gguf_pair["a"]), str(gguf_pair["b"])
    plain, one = _gen(cli_env, base), _gen(cli_env, base, "--lora", a)
    assert _gen(cli_env, base, "--lora-scaled", f"{a}:0") == plain  # scale 0 leaves it out: the base exactly
    assert _gen(cli_env, base, "--lora-scaled", f"{a}:1") == one
    both = _gen(cli_env, base, "--lora", f"{a},{b}")  # llama-server's comma list
    assert both not in (plain, one)
    assert _gen(cli_env, base, "--lora", a, "--lora", b) == both
    assert _gen(cli_env, base, "--lora", a, "--lora-scaled", f"{b}:0") == one
    assert _gen(cli_env, base, "--lora-scaled", f"{a}:0.5") not in (plain, one)


def test_an_adapter_for_another_shape_is_refused_in_one_line(gguf_pair, tmp_path, cli_env):
    import gguf_files

    pairs = {k: (a[:, :8], b) for k, (a, b) in _pairs(gguf_files.CONFIGS["llama"][1], 3).items()}
    wrong = gguf_files.write_lora(tmp_path / "wrong.gguf", "llama", pairs, ALPHA)
    r = subprocess.run(
        mlxcel_cmd() + ["generate", "-m", str(gguf_pair["base"]), "-p", "x", "--lora", str(wrong)],
        capture_output=True,
        text=True,
        env=cli_env,
    )
    assert r.returncode == 1 and "does not fit this model" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_python_api_fuses_the_same_adapters(gguf_pair, cli_env):
    import mlxcel_py

    model = mlxcel_py.load(str(gguf_pair["base"]), adapters=[(str(gguf_pair["a"]), 1.0), (str(gguf_pair["b"]), 0.5)])
    text = mlxcel_py.generate(model, PROMPT, max_tokens=40, chat_template=False)
    cli = _gen(cli_env, gguf_pair["base"], "--lora", str(gguf_pair["a"]), "--lora-scaled", f"{gguf_pair['b']}:0.5")
    assert text == cli.removesuffix("\n")

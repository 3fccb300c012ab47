"""KV cache types (--cache-type-k / --cache-type-v, models/kv_cache.py, csrc's KvType).

A float16 row is rounded once, when it is written, and widened exactly when it is read, so the
kernels over float16 buffers must give exactly what they give over float32 buffers holding the
same rounded values; speculative output must equal plain output at each type; the flags are
checked before any model loads, and a model that cannot keep the type says so and runs.
"""

from __future__ import annotations

import subprocess

import mlx.core as mx
import pytest
from conftest import mlxcel_cmd
from test_engine import engine_for, lookup, run

from mlxcel_py.cpu import extension as cpu_extension
from mlxcel_py.models import loading

QMM, WHY = cpu_extension.kernel_status()
needs_kernel = pytest.mark.skipif(QMM is None, reason=f"row-exact kernel: {WHY}")


def _rounded(x: mx.array) -> mx.array:
    return x.astype(mx.float16).astype(mx.float32)


@needs_kernel
@pytest.mark.parametrize("dim", [32, 64, 128, 48])  # 48: the one-row path for other head widths
@pytest.mark.parametrize("types", [("f16", "f16"), ("f16", "f32"), ("f32", "f16")])
def test_attention_over_float16_rows_is_attention_over_their_float32_values(dim, types):
    mx.random.seed(7)
    q = mx.random.normal((1, 6, 5, dim))
    kbuf, vbuf = mx.random.normal((1, 2, 90, dim)), mx.random.normal((1, 2, 90, dim))
    k16, v16 = (b.astype(mx.float16) if t == "f16" else b for b, t in zip((kbuf, vbuf), types))
    k32, v32 = (_rounded(b) if t == "f16" else b for b, t in zip((kbuf, vbuf), types))
    for causal in (True, False):
        got = QMM.row_exact_attention(q, k16[:, :, :80], v16[:, :, :80], 0.125, causal)  # strided views
        want = QMM.row_exact_attention(q, k32[:, :, :80], v32[:, :, :80], 0.125, causal)
        assert mx.array_equal(got, want).item(), (dim, types, causal)


@needs_kernel
def test_cache_attention_rounds_new_rows_once_and_reads_them_back():
    mx.random.seed(9)
    heads, kv, dim, length = 6, 2, 64, 3
    offsets = [4, 30]
    kbufs = [mx.random.normal((1, kv, o + length + 5, dim)).astype(mx.float16) for o in offsets]
    vbufs = [mx.random.normal((1, kv, o + length + 5, dim)).astype(mx.float16) for o in offsets]
    q = mx.random.normal((2, heads, length, dim))
    k_new, v_new = mx.random.normal((2, kv, length, dim)), mx.random.normal((2, kv, length, dim))
    got = QMM.row_exact_cache_attention(q, k_new, v_new, kbufs, vbufs, [0, 1], offsets, 0.125)
    for b, o in enumerate(offsets):
        kb, vb = got[1 + b], got[3 + b]
        assert kb.dtype == vb.dtype == mx.float16
        # MLX's astype and the kernel's conversion round alike (to nearest even)
        assert mx.array_equal(kb[:, :, o : o + length], k_new[b : b + 1].astype(mx.float16)).item()
        assert mx.array_equal(vb[:, :, o : o + length], v_new[b : b + 1].astype(mx.float16)).item()
        want = QMM.row_exact_attention(q[b : b + 1], kb[:, :, : o + length], vb[:, :, : o + length], 0.125, True)
        assert mx.array_equal(got[0][b : b + 1], want).item()
    with pytest.raises(ValueError, match="share one type"):  # one type a layer, as the cache type is
        QMM.row_exact_cache_attention(
            q, k_new, v_new, [kbufs[0], kbufs[1].astype(mx.float32)], vbufs, [0, 1], offsets, 0.125
        )
    with pytest.raises(ValueError, match="float32 or float16"):
        QMM.row_exact_attention(q, kbufs[0].astype(mx.bfloat16), vbufs[0], 0.125, False)


@needs_kernel
def test_move_rows_moves_float16_rows_as_they_are():
    buf = mx.arange(2 * 10 * 4).reshape(1, 2, 10, 4).astype(mx.float16)
    (moved,) = QMM.move_rows([buf], [5, 7], 2)
    assert moved.dtype == mx.float16
    assert mx.array_equal(moved[:, :, 2:4], buf[:, :, [5, 7]]).item()
    assert mx.array_equal(moved[:, :, :2], buf[:, :, :2]).item()


@needs_kernel
@pytest.mark.real
@pytest.mark.parametrize("cache_type", ["f32", "f16"])
def test_prompt_lookup_equals_plain_on_the_default_model_at_each_type(cache_type, workloads):
    from mlxcel_py.formats.prompting import prompt_ids

    lm = loading.load(loading.resolve(None), cache_types=(cache_type, cache_type))
    assert lm.kv_cache == f"{cache_type} keys, {cache_type} values"
    plain, spec = engine_for(lm), engine_for(lm, lookup("graded"))
    accepted = 0
    for item in workloads[::9]:
        ids = prompt_ids(lm.tokenizer, item["prompt"])
        want = run(plain, ids, max_tokens=32, remember=False)[0]
        got, g = run(spec, ids, max_tokens=32, remember=False)
        assert got == want, item["source"]
        accepted += g.stats.accepted
    assert accepted > 0


def _cli(cli_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*mlxcel_cmd(), *args], capture_output=True, text=True, env=cli_env, timeout=300)


def test_an_unknown_type_is_refused_before_loading(cli_env, no_weights):
    from mlxcel_py.errors import UsageError
    from mlxcel_py.options import CommandOptions, ModelOptions
    from mlxcel_py.validate import validate

    with pytest.raises(UsageError, match="--cache-type-v f8 is not one of auto, f32, f16"):
        validate(CommandOptions(command="generate", model=ModelOptions(cache_type_v="f8")))
    r = _cli(cli_env, "serve", "--port", "0", "-ctk", "f8")
    assert r.returncode == 2 and "--cache-type-k f8 is not one of auto, f32, f16" in r.stderr
    assert "Traceback" not in r.stderr


def test_llama_cpps_later_types_run_as_auto_with_a_note():
    # a llama-server command line (`-ctk q8_0`, llama.cpp's own test suite passes one) still starts
    from mlxcel_py.options import CommandOptions, ModelOptions
    from mlxcel_py.validate import validate

    run = validate(CommandOptions(command="generate", model=ModelOptions(cache_type_k="q8_0", cache_type_v="f32")))
    assert run.options.model.cache_types == ("auto", "f32")
    assert "--cache-type-k q8_0 is not supported yet; the KV cache runs as auto (auto, f32, f16 are)" in run.warnings


def test_the_note_reaches_stderr_and_generation_runs(cli_env, tiny_dir):
    r = _cli(cli_env, "generate", "-m", str(tiny_dir), "-p", "hi", "-n", "3", "--temp", "0", "-ctk", "q4_0")
    assert r.returncode == 0, r.stderr
    assert "--cache-type-k q4_0 is not supported yet" in r.stderr and r.stdout.strip()


@needs_kernel
def test_verbose_and_profile_name_the_type_in_use(cli_env, tiny_dir):
    r = _cli(
        cli_env,
        "generate",
        "-m",
        str(tiny_dir),
        "-p",
        "hello",
        "-n",
        "4",
        "--temp",
        "0",
        "-ctv",
        "f32",
        "--verbose",
        "--profile",
    )
    assert r.returncode == 0, r.stderr
    assert "KV cache f16 keys, f32 values" in r.stderr  # the `loaded in` line
    assert any(line.startswith("KV cache") and "f16 keys, f32 values" in line for line in r.stderr.splitlines())


def test_a_model_that_keeps_float32_says_so_and_runs(cli_env, tmp_path):
    import tiny_models

    folder = tiny_models.build(tmp_path / "gemma", tiny_models.FAMILIES["gemma3_text"])
    r = _cli(cli_env, "generate", "-m", str(folder), "-p", "hello", "-n", "3", "--temp", "0", "-ctk", "f16")
    assert r.returncode == 0, r.stderr
    assert "--cache-type-k f16: this model keeps a float32 KV cache" in r.stderr
    quiet = _cli(cli_env, "generate", "-m", str(folder), "-p", "hello", "-n", "3", "--temp", "0")
    assert "KV cache" not in quiet.stderr and quiet.stdout == r.stdout  # auto says nothing, same text

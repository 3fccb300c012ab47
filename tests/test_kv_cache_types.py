"""KV cache types (--cache-type-k / --cache-type-v, models/kv_cache.py, csrc's KvType).

A float16, bfloat16 or q8_0 row is rounded once, when it is written, and widened exactly when it
is read, so the kernels over such buffers must give exactly what they give over float32 buffers
holding the same rounded values (q8_0 and q4_0 rows are of the rotated row, and read with the
query rotated alike); speculative output must equal plain output at each type; the
flags (and mlx-lm's --kv-bits) are checked before any model loads, and a model that cannot keep
the type says so and runs.
"""

from __future__ import annotations

import subprocess

import mlx.core as mx
import numpy as np
import pytest
from conftest import make_tiny_model, mlxcel_cmd
from test_engine import engine_for, lookup, run

from mlxcel_py.cpu import extension as cpu_extension
from mlxcel_py.models import loading

QMM, WHY = cpu_extension.kernel_status()
needs_kernel = pytest.mark.skipif(QMM is None, reason=f"row-exact kernel: {WHY}")


DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16, "q8_0": mx.int8, "q4_0": mx.uint8}
BLOCKS = ("q8_0", "q4_0")


def _stored(x: mx.array, t: str) -> mx.array:
    """float32 rows as a buffer of cache type t (q8_0, q4_0: the kernels' own rounding)."""
    return QMM.kv_rows(x, DTYPES[t]) if t in BLOCKS else x.astype(DTYPES[t])


def _rotate(x: np.ndarray) -> np.ndarray:
    """csrc attention_kernel.cpp's rotate() over the last axis, the same float32 operations in
    the same order: the Hadamard butterflies (u + w, u - w), then times 2^-floor(log2(D)/2)."""
    x = np.array(x, dtype=np.float32, copy=True)
    n = x.shape[-1]
    length = 1
    while length < n:
        y = x.reshape(*x.shape[:-1], n // (2 * length), 2, length)
        u, w = y[..., 0, :].copy(), y[..., 1, :].copy()
        y[..., 0, :], y[..., 1, :] = u + w, u - w
        x = y.reshape(x.shape)
        length *= 2
    return x * np.float32(0.25 if n == 32 else 0.125)


def _gain(dim: int) -> float:
    """1 / (c^2 D): rotating twice multiplies by c^2 D (1 at head dim 64, 2 at 32 and 128)."""
    return 1.0 if dim == 64 else 0.5


def _unrotate(x: np.ndarray) -> np.ndarray:
    return _rotate(x) * np.float32(_gain(x.shape[-1]))


def _values(buf: mx.array, dim: int) -> mx.array:
    """What a buffer's rows stand for, as float32 (`_block_values` taken back from the rotated
    basis for q8_0 and q4_0)."""
    if buf.dtype not in (mx.int8, mx.uint8):
        return buf.astype(mx.float32)
    return mx.array(_unrotate(np.array(_block_values(buf, dim))))


def _block_values(buf: mx.array, dim: int) -> mx.array:
    """What a buffer's rows hold, as float32: q8_0 rows are q * d per block of 32, q4_0 rows
    (q - 8) * d with byte j of a block holding values j (low nibble) and j + 16 (high); both of
    the row rotated (csrc store_kv_row)."""
    if buf.dtype not in (mx.int8, mx.uint8):
        return buf.astype(mx.float32)
    lead, n = buf.shape[:-1], dim // 32
    if buf.dtype == mx.int8:
        q, scales = buf[..., :dim].astype(mx.float32).reshape(*lead, n, 32), buf[..., dim:]
    else:
        packed = buf[..., : dim // 2].reshape(*lead, n, 16)
        q = mx.concatenate([packed & 15, packed >> 4], axis=-1).astype(mx.float32) - 8
        scales = buf[..., dim // 2 :]
    d = scales.view(mx.float16).astype(mx.float32).reshape(*lead, n, 1)
    return (q * d).reshape(*lead, dim)


def _q8_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's quantize_row_q8_0 (ggml-quants.c), written out: per block of 32, d = max|x| /
    127 kept as float16, q = round(x / d) rounding halves away from zero."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    y = blocks * inv[:, None]
    q = np.clip(np.sign(y) * np.floor(np.abs(y) + np.float32(0.5)), -127, 127).astype(np.int8)
    return q, d.astype(np.float16)


def _q4_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's quantize_row_q4_0_ref: d = m / -8 with m the block's value of the largest
    magnitude (kept as float16), q = min(15, trunc(x / d + 8.5)); the 32 q of a block in order."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    m = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
    d = m / np.float32(-8)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(15, np.trunc(blocks * inv[:, None] + np.float32(8.5))).astype(np.uint8)
    return q, d.astype(np.float16)


PAIRS = [
    ("f16", "f16"),
    ("f16", "f32"),
    ("f32", "f16"),
    ("bf16", "bf16"),
    ("q8_0", "q8_0"),
    ("q8_0", "f16"),
    ("q4_0", "q4_0"),
    ("f32", "q4_0"),
]


@needs_kernel
@pytest.mark.parametrize("dim", [32, 64, 128, 48])  # 48: the one-row path for other head widths
@pytest.mark.parametrize("types", PAIRS, ids="-".join)
def test_attention_over_rounded_rows_is_attention_over_their_float32_values(dim, types):
    mx.random.seed(7)
    q = mx.random.normal((1, 6, 5, dim))
    kbuf, vbuf = mx.random.normal((1, 2, 90, dim)), mx.random.normal((1, 2, 90, dim))
    if set(types) & set(BLOCKS) and dim == 48:  # q8_0/q4_0 run at head dims 32, 64, 128 (else the loader keeps f16)
        with pytest.raises(ValueError, match="q8_0 and q4_0 rows hold whole blocks of 32"):
            _stored(kbuf, next(t for t in types if t in BLOCKS))
        return
    ks, vs = (_stored(b, t) for b, t in zip((kbuf, vbuf), types))
    # q8_0/q4_0 rows are read in their rotated basis: the query goes in rotated and the output
    # comes back, exactly as the kernel does it (the same float32 operations)
    k32, v32 = (_block_values(b, dim) if b.dtype in (mx.int8, mx.uint8) else b.astype(mx.float32) for b in (ks, vs))
    k_rot, v_rot = (t in BLOCKS for t in types)
    q_in = mx.array(_rotate(np.array(q))) if k_rot else q
    scale = 0.125 * _gain(dim) if k_rot else 0.125
    for causal in (True, False):
        got = QMM.row_exact_attention(q, ks[:, :, :80], vs[:, :, :80], 0.125, causal)  # strided views
        want = QMM.row_exact_attention(q_in, k32[:, :, :80], v32[:, :, :80], scale, causal)
        if v_rot:
            want = mx.array(_unrotate(np.array(want)))
        assert mx.array_equal(got, want).item(), (dim, types, causal)
        # and it is attention over what the rows stand for, up to float32 rounding
        plain = QMM.row_exact_attention(q, _values(ks, dim)[:, :, :80], _values(vs, dim)[:, :, :80], 0.125, causal)
        assert mx.allclose(got, plain, atol=1e-5, rtol=1e-4).item()
        one = QMM.row_exact_attention(q[:, :, -1:], ks[:, :, :80], vs[:, :, :80], 0.125, causal)  # a decode row
        assert mx.array_equal(one, got[:, :, -1:]).item()


@needs_kernel
def test_q8_0_rows_are_llama_cpps_blocks_and_bfloat16_rows_mlxs_rounding():
    mx.random.seed(3)
    x = mx.random.normal((3, 4, 128)) * mx.array([0.01, 1.0, 30.0, 0.0])[None, :, None]  # a zero row too
    rows = QMM.kv_rows(x, mx.int8)
    assert rows.shape == (3, 4, 136) and rows.dtype == mx.int8
    rotated = _rotate(np.array(x)).reshape(-1, 128)  # the blocks are of the rotated row
    q, d = _q8_reference(rotated)
    got = np.array(rows).reshape(-1, 136)
    assert np.array_equal(got[:, :128].reshape(-1, 32), q)
    assert np.array_equal(got[:, 128:].copy().view(np.float16).reshape(-1), d)
    step = np.abs(rotated).max() / 127
    err = np.abs(np.array(_block_values(rows, 128)).reshape(-1, 128) - rotated).max()
    assert 0 < err <= step / 2 * 1.01  # half a step of the largest block's scale
    # the rows stand for x: the rotation spreads the error over the row (RMS, per scale of row)
    rms = float(mx.sqrt(mx.mean((_values(rows, 128) - x) ** 2, axis=-1)).max().item())
    assert rms <= 30.0 * 4 / 127 / 2
    rows4 = QMM.kv_rows(x, mx.uint8)
    assert rows4.shape == (3, 4, 72) and rows4.dtype == mx.uint8
    q4, d4 = _q4_reference(rotated)
    got4 = np.array(rows4).reshape(-1, 72)
    nibbles = got4[:, :64].reshape(-1, 16)
    assert np.array_equal(np.concatenate([nibbles & 15, nibbles >> 4], axis=1), q4)
    assert np.array_equal(got4[:, 64:].copy().view(np.float16).reshape(-1), d4)
    assert np.abs(np.array(_block_values(rows4, 128)).reshape(-1, 128) - rotated).max() <= step * 127 / 8 * 1.01
    zero = np.array(_values(rows, 128))[:, 3]  # the zero row stays zero
    assert not zero.any()
    assert mx.array_equal(QMM.kv_rows(x, mx.bfloat16), x.astype(mx.bfloat16)).item()
    assert mx.array_equal(QMM.kv_rows(x, mx.float16), x.astype(mx.float16)).item()


@needs_kernel
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_cache_attention_rounds_new_rows_once_and_reads_them_back(kind):
    mx.random.seed(9)
    heads, kv, dim, length = 6, 2, 64, 3
    offsets = [4, 30]
    kbufs = [_stored(mx.random.normal((1, kv, o + length + 5, dim)), kind) for o in offsets]
    vbufs = [_stored(mx.random.normal((1, kv, o + length + 5, dim)), kind) for o in offsets]
    q = mx.random.normal((2, heads, length, dim))
    k_new, v_new = mx.random.normal((2, kv, length, dim)), mx.random.normal((2, kv, length, dim))
    got = QMM.row_exact_cache_attention(q, k_new, v_new, kbufs, vbufs, [0, 1], offsets, 0.125)
    for b, o in enumerate(offsets):
        kb, vb = got[1 + b], got[3 + b]
        assert kb.dtype == vb.dtype == DTYPES[kind]
        # MLX's astype and the kernel's conversion round alike (to nearest even); q8_0 as kv_rows
        assert mx.array_equal(kb[:, :, o : o + length], _stored(k_new[b : b + 1], kind)).item()
        assert mx.array_equal(vb[:, :, o : o + length], _stored(v_new[b : b + 1], kind)).item()
        want = QMM.row_exact_attention(q[b : b + 1], kb[:, :, : o + length], vb[:, :, : o + length], 0.125, True)
        assert mx.array_equal(got[0][b : b + 1], want).item()
    with pytest.raises(ValueError, match="share one type"):  # one type a layer, as the cache type is
        QMM.row_exact_cache_attention(
            q, k_new, v_new, [kbufs[0], kbufs[1].astype(mx.float32)], vbufs, [0, 1], offsets, 0.125
        )
    with pytest.raises(ValueError, match=r"float32, float16, bfloat16, q8_0 \(int8\) or q4_0"):
        QMM.row_exact_attention(q, kbufs[0].astype(mx.int32), vbufs[0], 0.125, False)


@needs_kernel
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.int8, mx.uint8])
def test_move_rows_moves_rows_of_each_type_as_they_are(dtype):
    buf = mx.arange(2 * 10 * 4).reshape(1, 2, 10, 4).astype(dtype)
    (moved,) = QMM.move_rows([buf], [5, 7], 2)
    assert moved.dtype == dtype
    assert mx.array_equal(moved[:, :, 2:4], buf[:, :, [5, 7]]).item()
    assert mx.array_equal(moved[:, :, :2], buf[:, :, :2]).item()


@needs_kernel
@pytest.mark.real
@pytest.mark.parametrize("cache_type", ["f32", "f16", "bf16", "q8_0", "q4_0"])
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

    names = "auto, f32, f16, bf16, q8_0, q4_0"
    with pytest.raises(UsageError, match=f"--cache-type-v f8 is not one of {names}"):
        validate(CommandOptions(command="generate", model=ModelOptions(cache_type_v="f8")))
    r = _cli(cli_env, "serve", "--port", "0", "-ctk", "f8")
    assert r.returncode == 2 and f"--cache-type-k f8 is not one of {names}" in r.stderr
    assert "Traceback" not in r.stderr


def test_llama_cpps_later_types_run_as_q8_0_with_a_note():
    # a llama-server command line (`-ctk q5_1`) still starts
    from mlxcel_py.options import CommandOptions, ModelOptions
    from mlxcel_py.validate import validate

    run = validate(CommandOptions(command="generate", model=ModelOptions(cache_type_k="q5_1", cache_type_v="f32")))
    assert run.options.model.cache_types == ("q8_0", "f32")
    assert (
        "--cache-type-k q5_1 is not built here; the KV cache runs as q8_0, the nearest type at least as precise "
        "(auto, f32, f16, bf16, q8_0, q4_0 are built)" in run.warnings
    )


@pytest.mark.parametrize(
    ("bits", "group", "types", "error"),
    [
        (8, None, ("q8_0", "q8_0"), None),
        (8, 32, ("q8_0", "q8_0"), None),
        (8, 64, ("q8_0", "q8_0"), None),  # mlx-lm's default group: q8_0's blocks of 32 are finer
        (4, None, ("q4_0", "q4_0"), None),
        (3, None, None, "--kv-bits 3 is not one of 8, 4"),
        (8, 16, None, "--kv-group-size 16 is not one of 32, 64"),
        (None, 64, None, "--kv-group-size goes with --kv-bits"),
    ],
)
def test_mlx_lms_kv_bits_name_the_q8_0_cache(bits, group, types, error):
    from mlxcel_py.errors import UsageError
    from mlxcel_py.options import CommandOptions, ModelOptions
    from mlxcel_py.validate import validate

    opts = CommandOptions(command="generate", model=ModelOptions(kv_bits=bits, kv_group_size=group))
    if error:
        with pytest.raises(UsageError, match=error):
            validate(opts)
        return
    assert validate(opts).options.model.cache_types == types


def test_kv_bits_beside_a_cache_type_is_refused_on_the_command_line(cli_env, no_weights):
    r = _cli(cli_env, "generate", "-p", "hi", "--kv-bits", "8", "-ctv", "f16")
    assert r.returncode == 2, r.stderr
    assert "--kv-bits names the cache type; drop it or --cache-type-k/--cache-type-v" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_note_reaches_stderr_and_generation_runs(cli_env, tiny_dir):
    r = _cli(cli_env, "generate", "-m", str(tiny_dir), "-p", "hi", "-n", "3", "--temp", "0", "-ctk", "iq4_nl")
    assert r.returncode == 0, r.stderr
    assert "--cache-type-k iq4_nl is not built here; the KV cache runs as q8_0" in r.stderr and r.stdout.strip()


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


def test_a_model_on_mlx_lms_layers_takes_f16_and_says_where_q8_0_keeps_f16(cli_env, tmp_path):
    import tiny_models

    folder = tiny_models.build(tmp_path / "gemma", tiny_models.FAMILIES["gemma3_text"])
    base = ["generate", "-m", str(folder), "-p", "hello", "-n", "3", "--temp", "0", "--verbose"]
    r = _cli(cli_env, *base, "-ctk", "f16")
    assert r.returncode == 0, r.stderr
    assert "KV cache f16 keys, f32 values" in r.stderr and "float32 KV cache" not in r.stderr
    q8 = _cli(cli_env, *base, "-ctk", "q8_0")
    assert q8.returncode == 0, q8.stderr
    assert "--cache-type-k q8_0: q8_0 and q4_0 blocks are written by the fused decoder layers only" in q8.stderr
    assert "KV cache f16 keys, f32 values" in q8.stderr and q8.stdout == r.stdout
    quiet = _cli(cli_env, "generate", "-m", str(folder), "-p", "hello", "-n", "3", "--temp", "0")
    assert "KV cache" not in quiet.stderr  # auto says nothing (float32 on these layers)


@needs_kernel
def test_kv_bits_8_runs_the_q8_0_cache_and_prompt_lookup_equals_plain(cli_env, tmp_path):
    folder = make_tiny_model(tmp_path / "m", seed=1, hidden=128, scale=2.5)  # head dim 32 (q8_0 needs 32/64/128)
    base = ["generate", "-m", str(folder), "-p", "one two three one two three one two", "-n", "24", "--temp", "0"]
    plain = _cli(cli_env, *base, "--kv-bits", "8", "--verbose")
    assert plain.returncode == 0, plain.stderr
    assert "KV cache q8_0 keys, q8_0 values" in plain.stderr
    spec = _cli(cli_env, *base, "-ctk", "q8_0", "-ctv", "q8_0", "--prompt-lookup")
    assert spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout and plain.stdout.strip()


@needs_kernel
def test_q8_0_at_a_head_dim_it_cannot_read_keeps_f16_and_says_so(tmp_path):
    import tiny_models
    from test_decoder_layers import BASE

    cfg = dict(BASE, model_type="llama", hidden_size=96, num_attention_heads=2, num_key_value_heads=1)
    folder = tiny_models.build(tmp_path / "m", cfg)  # head dim 48
    lm = loading.load(loading.resolve(str(folder)), cache_types=("q8_0", "q4_0"))
    assert lm.kv_cache == "f16 keys, f16 values"
    assert (
        "--cache-type-k q8_0 and --cache-type-v q4_0: a head dim of 48 is not one q8_0 and q4_0 run at (32, 64, 128)"
        in lm.kv_note
    )

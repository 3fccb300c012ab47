"""The row-exact quantized matmul and attention (csrc/, `mlxcel_py._qmm`) and `--cpu-weights`.

Kernel tests need the extension built and a CPU with AVX-512 VNNI or AVX2 (MLXCEL_KERNEL_ISA picks one); `make test` prints which path
this machine has in its header line, and those tests are skipped (not passed) without it.
"""

from __future__ import annotations

import random

import mlx.core as mx
import mlx.nn as nn
import pytest
from test_engine import engine_for, run

from mlxcel_py.cpu import extension as cpu_extension
from mlxcel_py.cpu import layers as cpu_layers
from mlxcel_py.cpu import weights as cpu_weights
from mlxcel_py.options import SamplingOptions

QMM, WHY = cpu_extension.kernel_status()
needs_kernel = pytest.mark.skipif(QMM is None, reason=f"row-exact kernel: {WHY}")


def _quantized(n: int, k: int, bits: int, group: int = 32, seed: int = 0):
    """(kernel weight, scales, biases, the dequantized float32 matrix) for a random n x k matrix."""
    mx.random.seed(seed)
    w = mx.random.normal((n, k)) * 0.05
    wq, s, b = mx.quantize(w, group_size=group, bits=bits)
    dense = mx.dequantize(wq, s, b, group_size=group, bits=bits)
    per_block = lambda a: QMM.interleave(mx.repeat(a.astype(mx.float32), group // 32, axis=1))
    return QMM.repack(wq, bits), per_block(s), per_block(b), dense


def _bound(x: mx.array, dense: mx.array) -> mx.array:
    """The int8 activation rounding bound: per block of 32, |x - x_q| <= amax / 254, so an output
    is off by at most sum over blocks of amax_b / 254 * sum |w| in the block (plus float slack)."""
    m, k = x.shape
    amax = mx.abs(x).reshape(m, k // 32, 32).max(axis=-1)  # [M, blocks]
    wsum = mx.abs(dense).reshape(dense.shape[0], k // 32, 32).sum(axis=-1)  # [N, blocks]
    return (amax / 254.0) @ wsum.T * 1.001 + 1e-5


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_matches_dequantized_matmul_within_the_rounding_bound_for_every_m(bits):
    rng = random.Random(bits)
    for m in range(1, 66):
        n, k = rng.choice([(48, 64), (130, 576), (96, 1024), (64, 1536)])
        w, s, b, dense = _quantized(n, k, bits, group=rng.choice([32, 64]), seed=m)
        x = mx.random.normal((m, k)) * rng.choice([0.1, 1.0, 30.0])
        got, want = QMM.row_exact_qmm(x, w, s, b, bits), x @ dense.T
        excess = (mx.abs(got - want) - _bound(x, dense)).max().item()
        assert excess <= 0, (m, n, k, excess)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_each_row_is_bit_identical_to_the_one_row_product(bits):
    rng = random.Random(10 + bits)
    w, s, b, _ = _quantized(200, 576, bits)  # 12 groups of 16 rows and one of 8
    for _trial in range(12):
        m = rng.randint(2, cpu_layers.KERNEL_ROWS)
        x = mx.random.normal((m, 576))
        block = QMM.row_exact_qmm(x, w, s, b, bits)
        for i in rng.sample(range(m), min(m, 5)):
            one = QMM.row_exact_qmm(x[i : i + 1], w, s, b, bits)
            assert mx.array_equal(block[i : i + 1], one).item(), (m, i)
        # the same row anywhere in another block (other neighbours, other position)
        j = rng.randrange(m)
        other = mx.concatenate([mx.random.normal((3, 576)), x[j : j + 1]])
        assert mx.array_equal(QMM.row_exact_qmm(other, w, s, b, bits)[3], block[j]).item()


needs_amx = pytest.mark.skipif(QMM is None or not QMM.amx_supported(), reason="no AMX int8 tiles on this CPU/OS")


@needs_amx
@pytest.mark.parametrize("bits", [4, 8])
def test_amx_tiles_give_the_vnni_rows_bit_for_bit(bits):
    # every block height (whole tiles of 16, a last partial one, fewer than 16) and a weight whose
    # last group has 8 rows: the AMX path and the VNNI path must give the same bits
    try:
        for n, k in ((200, 576), (48, 64), (64, 1536)):
            w, s, b, _ = _quantized(n, k, bits, seed=n + k)
            for m in list(range(1, 41)) + [63, 64, 65, 130]:
                x = mx.random.normal((m, k)) * (30.0 if m % 3 == 0 else 1.0)
                assert QMM.set_amx_rows(0) is False
                vnni = QMM.row_exact_qmm(x, w, s, b, bits)
                mx.eval(vnni)
                assert QMM.set_amx_rows(1) is True
                amx = QMM.row_exact_qmm(x, w, s, b, bits)
                assert mx.array_equal(vnni, amx).item(), (n, k, m)
    finally:
        QMM.set_amx_rows(cpu_extension.AMX_ROWS)


@needs_amx
def test_amx_can_be_turned_off_by_environment(cli_env):
    import subprocess
    import sys

    code = "from mlxcel_py.cpu import extension; print(extension.kernel_status()[1], extension.kernel_status()[0].amx_rows())"
    plain_env = {k: v for k, v in cli_env.items() if k != "MLXCEL_NO_AMX"}
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=plain_env, check=True)
    off = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**cli_env, "MLXCEL_NO_AMX": "1"}
    )
    assert on.stdout.split()[-1] == str(cpu_extension.AMX_ROWS) and "AMX tiles" in on.stdout
    assert off.stdout.split()[-1] == "0" and "AMX" not in off.stdout


@needs_kernel
def test_threads_and_batch_shape_do_not_change_a_bit():
    w, s, b, _ = _quantized(1536, 576, 4)
    x = mx.random.normal((2, 7, 576))
    ref = QMM.row_exact_qmm(x, w, s, b, 4)
    try:
        for t in (1, 2, 3):
            QMM.set_threads(t)
            assert mx.array_equal(QMM.row_exact_qmm(x.reshape(14, 576), w, s, b, 4).reshape(2, 7, 1536), ref).item()
            # a strided (transposed) input gives the same rows
            xt = mx.random.normal((576, 5)).T
            assert mx.array_equal(
                QMM.row_exact_qmm(xt, w, s, b, 4), QMM.row_exact_qmm(mx.array(xt.tolist()), w, s, b, 4)
            ).item()
    finally:
        QMM.set_threads(cpu_extension.default_threads())


@needs_kernel
def test_fused_weights_equal_separate_calls():
    parts = [_quantized(n, 576, 8, seed=n) for n in (576, 192, 192)]
    x = mx.random.normal((5, 576))
    fused = QMM.row_exact_qmm_multi(x, [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts], 8)
    for y, (w, s, b, _) in zip(fused, parts):
        assert mx.array_equal(y, QMM.row_exact_qmm(x, w, s, b, 8)).item()


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_repack_round_trips_and_dequantize_rows_matches_mlx(bits):
    for k in (64, 576, 1024, 1536):
        mx.random.seed(k)
        wq, s, b = mx.quantize(mx.random.normal((37, k)), group_size=32, bits=bits)
        packed = QMM.repack(wq, bits)
        assert packed.dtype == mx.uint8 and packed.shape == (37, k * bits // 8)
        # MLX's own values: dequantize with scale 1 and bias 0
        ones, zeros = mx.ones_like(s), mx.zeros_like(b)
        q = mx.dequantize(wq, ones, zeros, group_size=32, bits=bits).astype(mx.uint8)
        assert mx.array_equal(QMM.unpack(packed, bits), q).item()
        s, b = s.astype(mx.float32), b.astype(mx.float32)
        si, bi = QMM.interleave(s), QMM.interleave(b)  # 37 rows: two groups of 16 and one of 5
        rows = QMM.dequantize_rows(packed, si, bi, bits, mx.array([[3, 0], [36, 3]]))
        want = mx.dequantize(wq, s, b, group_size=32, bits=bits)
        assert rows.shape == (2, 2, k)
        assert (
            mx.allclose(rows[0, 0], want[3], atol=1e-6).item() and mx.allclose(rows[1, 0], want[36], atol=1e-6).item()
        )
        assert mx.allclose(QMM.dequantize_rows(packed, si, bi, bits), want, atol=1e-6).item()


@needs_kernel
def test_bad_arguments_are_refused_with_a_message():
    w, s, b, _ = _quantized(8, 64, 8)
    with pytest.raises(ValueError, match="multiple of 64"):
        QMM.row_exact_qmm(mx.zeros((1, 32)), w, s, b, 8)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        QMM.row_exact_qmm(mx.zeros((1, 64)), w, s, b, 3)
    with pytest.raises(ValueError, match="float32"):
        QMM.row_exact_qmm(mx.zeros((1, 64)), w, s.astype(mx.float16), b, 8)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        QMM.row_exact_attention(mx.zeros((1, 3, 1, 16)), mx.zeros((1, 2, 4, 16)), mx.zeros((1, 2, 4, 16)), 1.0, False)


@needs_kernel
def test_attention_matches_mlx_and_each_row_equals_its_decode_step():
    from mlx_lm.models.base import scaled_dot_product_attention as sdpa

    mx.random.seed(3)
    for s_len, length, dim in ((40, 1, 64), (40, 8, 64), (100, 33, 64), (20, 20, 48), (70, 65, 80)):
        q = mx.random.normal((1, 6, length, dim))
        kbuf, vbuf = mx.random.normal((1, 2, s_len + 9, dim)), mx.random.normal((1, 2, s_len + 9, dim))
        k, v = kbuf[:, :, :s_len], vbuf[:, :, :s_len]  # strided views, as the KV cache hands them out
        causal = length > 1
        got = QMM.row_exact_attention(q, k, v, 0.125, causal)
        want = sdpa(q, k, v, None, scale=0.125, mask="causal" if causal else None)
        assert mx.allclose(got, want, atol=2e-6, rtol=1e-5).item()
        for i in range(length):
            visible = s_len - length + i + 1
            one = QMM.row_exact_attention(q[:, :, i : i + 1], k[:, :, :visible], v[:, :, :visible], 0.125, False)
            assert mx.array_equal(one, got[:, :, i : i + 1]).item(), (s_len, length, i)


@needs_kernel
def test_cache_attention_writes_each_sequence_and_equals_its_own_attention():
    """serve's fused layer op: three sequences of different lengths, a 3-row block each; every row
    equals row_exact_attention over that sequence alone, the new rows land at each offset, and a
    buffer still held elsewhere is copied (the holder's array is unchanged) while the rest are
    updated in place."""
    mx.random.seed(5)
    heads, kv, dim, length = 6, 2, 64, 3
    offsets = [4, 30, 0]
    kbufs = [mx.random.normal((1, kv, o + length + 5, dim)) for o in offsets]
    vbufs = [mx.random.normal((1, kv, o + length + 5, dim)) for o in offsets]
    mx.eval(kbufs, vbufs)
    q = mx.random.normal((3, heads, length, dim))
    k_new, v_new = mx.random.normal((3, kv, length, dim)), mx.random.normal((3, kv, length, dim))
    mx.eval(q, k_new, v_new)
    held = kbufs[1]  # someone else's reference: this buffer must not change under them
    before = mx.array(held)
    mx.eval(before)
    old = [(mx.array(kb), mx.array(vb)) for kb, vb in zip(kbufs, vbufs)]
    mx.eval(old)
    donated0, copied0 = QMM.buffer_updates()
    got = QMM.row_exact_cache_attention(q, k_new, v_new, kbufs, vbufs, [0, 1, 2], offsets, 0.125)
    del kbufs, vbufs
    mx.eval(got)
    donated, copied = (a - b for a, b in zip(QMM.buffer_updates(), (donated0, copied0)))
    assert (donated, copied) == (5, 1)
    assert mx.array_equal(held, before).item()
    out = got[0]
    for b, o in enumerate(offsets):
        kb, vb = got[1 + b], got[4 + b]
        assert mx.array_equal(kb[:, :, o : o + length], k_new[b : b + 1]).item()
        assert mx.array_equal(vb[:, :, :o], old[b][1][:, :, :o]).item()
        want = QMM.row_exact_attention(q[b : b + 1], kb[:, :, : o + length], vb[:, :, : o + length], 0.125, True)
        assert mx.array_equal(out[b : b + 1], want).item(), b
    with pytest.raises(ValueError, match="entry 0"):
        QMM.row_exact_cache_attention(
            q,
            k_new,
            v_new,
            [mx.zeros((1, kv, 2, dim))] * 3,
            [mx.zeros((1, kv, 9, dim))] * 3,
            [0, 1, 2],
            [0, 0, 0],
            0.125,
        )


@needs_kernel
def test_a_prompt_chunk_beside_decode_rows_splits_over_threads_and_stays_exact():
    """A batched layer as serve runs it under load: a 64-row prompt chunk (192 queries a KV head,
    each seeing few keys) beside 8 sequences' 3-row verify blocks over 300 keys. The threads split
    the work by visible keys, cutting the chunk's head into parts, and the queries of a head go
    through in groups; every row still equals its own one-row call bit for bit."""
    mx.random.seed(11)
    heads, kv, dim = 9, 3, 64
    lengths, offsets = [64] + [3] * 8, [20] + [300 + 7 * i for i in range(8)]
    kbufs = [mx.random.normal((1, kv, o + n + 3, dim)) for o, n in zip(offsets, lengths)]
    vbufs = [mx.random.normal((1, kv, o + n + 3, dim)) for o, n in zip(offsets, lengths)]
    seq = [b for b, n in enumerate(lengths) for _ in range(n)]
    pos = [o + i for o, n in zip(offsets, lengths) for i in range(n)]
    q = mx.random.normal((len(seq), heads, 1, dim))
    k_new, v_new = mx.random.normal((len(seq), kv, 1, dim)), mx.random.normal((len(seq), kv, 1, dim))
    mx.eval(kbufs, vbufs, q, k_new, v_new)
    threads = QMM.threads()
    QMM.set_threads(2)
    try:
        got = QMM.row_exact_cache_attention(q, k_new, v_new, kbufs, vbufs, seq, pos, 0.125)
        mx.eval(got)
    finally:
        QMM.set_threads(threads)
    out = got[0]
    for e, (b, p) in enumerate(zip(seq, pos)):
        kb, vb = got[1 + b], got[1 + len(lengths) + b]
        want = QMM.row_exact_attention(q[e : e + 1], kb[:, :, : p + 1], vb[:, :, : p + 1], 0.125, False)
        assert mx.array_equal(out[e : e + 1], want).item(), (e, b, p)


@needs_kernel
def test_row_rope_matches_mlx_and_each_entry_its_own_call():
    """The extension's rope (RowExactRoPE): within float rounding of nn.RoPE (it takes cos and sin
    in double), entries at their own offsets equal one-entry calls bit for bit, and the rest of a
    head past `dims` is copied."""
    mx.random.seed(7)
    for trad in (False, True):
        for dims in (64, 32):
            rope = nn.RoPE(dims, traditional=trad, base=100000)
            x = mx.random.normal((3, 5, 4, 64)) * 3
            assert mx.allclose(QMM.row_rope(x, dims, trad, 100000.0, 1.0, 40), rope(x, offset=40), atol=2e-4).item()
            offs = mx.array([0, 77, 700])
            xt = mx.random.normal((3, 4, 5, 64)).transpose(0, 2, 1, 3)  # the projections' strided view
            got = QMM.row_rope(xt, dims, trad, 100000.0, 1.0, 0, offs)
            assert mx.allclose(got, rope(xt, offset=offs), atol=2e-4).item()
            for b, o in enumerate((0, 77, 700)):
                assert mx.array_equal(got[b : b + 1], QMM.row_rope(xt[b : b + 1], dims, trad, 100000.0, 1.0, o)).item()
            # offsets as an evaluated int32 vector go in as they are; any other form (computed
            # lazily, another dtype, a strided view) is made one first: the same rows
            spaced = mx.array([0, 5, 77, 5, 700])
            for other in (offs * 1, offs.astype(mx.int64), spaced[::2]):
                assert mx.array_equal(QMM.row_rope(xt, dims, trad, 100000.0, 1.0, 0, other), got).item()
            if dims < 64:
                assert mx.array_equal(got[..., dims:], xt[..., dims:]).item()
    with pytest.raises(ValueError, match="even"):
        QMM.row_rope(mx.zeros((1, 1, 1, 64)), 63, False, 1e4, 1.0)


@needs_kernel
def test_row_swiglu_matches_mlx():
    gate, up = mx.random.normal((37, 1, 1536)) * 6, mx.random.normal((37, 1, 1536))
    gate = mx.concatenate([gate, mx.array([[[-200.0, 200.0] + [0.0] * 1534]])])
    up = mx.concatenate([up, mx.ones((1, 1, 1536))])
    got = QMM.row_swiglu(gate, up)
    assert mx.allclose(got, nn.silu(gate) * up, atol=1e-5, rtol=1e-5).item()
    # the extremes stay finite: silu(-200) is -200 * 1 / (1 + e^88), silu(200) is 200
    assert abs(got[-1, 0, 0].item()) < 1e-30 and got[-1, 0, 1].item() == 200.0


def _block_vs_steps(model, prompt: list[int], toks: list[int]) -> list[bool]:
    """Logits of a verify-shaped block against one-token steps at the same positions."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_py.cpu import kernels as cpu_kernels

    with cpu_kernels.engaged(model):
        c1 = make_prompt_cache(model)
        mx.eval(model(mx.array([prompt]), cache=c1))
        steps = [model(mx.array([[t]]), cache=c1)[0, -1] for t in toks]
        c2 = make_prompt_cache(model)
        mx.eval(model(mx.array([prompt]), cache=c2))
        block = model(mx.array([toks]), cache=c2)[0]
        mx.eval(steps, block)
    return [mx.array_equal(s, block[i]).item() for i, s in enumerate(steps)]


@needs_kernel
@pytest.mark.real
def test_default_model_block_rows_equal_decode_steps_bit_for_bit(real):
    assert real.weights is not None and real.weights.kernel_layers > 0 and not real.weights.inexact
    prompt = real.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)
    assert _block_vs_steps(real.model, prompt, [17, 99, 512, 1000, 42, 7, 6, 5, 600, 30]) == [True] * 10


@needs_kernel
@pytest.mark.real
def test_every_drafter_equals_plain_on_the_default_model(real, workloads):
    """Greedy speculative output == plain output token for token on the kernel path: prompt
    lookup (each policy runs in test_real_model), the suffix drafter and the default model
    drafting for itself. MTP and the Gemma 4 assistant need models this one is not (they run,
    on float32, in test_mtp.py / test_gemma4_assistant.py)."""
    from test_engine import engine_for, lookup, run

    from mlxcel_py.formats.prompting import prompt_ids
    from mlxcel_py.options import DraftConfig, LookupConfig

    configs = {
        "prompt-lookup": engine_for(real, lookup("graded")),
        "suffix": engine_for(real, DraftConfig(kind="suffix", lookup=LookupConfig(max_draft=16))),
        "full-model": engine_for(real, DraftConfig(kind="full-model", block_size=4), draft_model=real.model),
    }
    plain = engine_for(real)
    accepted = {name: 0 for name in configs}
    for item in workloads[1::6]:
        ids = prompt_ids(real.tokenizer, item["prompt"])
        want = run(plain, ids, max_tokens=24, remember=False)[0]
        for name, eng in configs.items():
            got, g = run(eng, ids, max_tokens=24, remember=False)
            assert got == want, (name, item["source"])
            accepted[name] += g.stats.accepted
    assert all(accepted.values()), accepted


@pytest.mark.parametrize("family", ["qwen3_5", "gemma3_text"])
def test_auto_keeps_float32_where_rows_could_differ(tmp_path, family):
    """A hybrid (recurrent state) model and a sliding-window one stay float32 under auto, saying why."""
    import tiny_models

    from mlxcel_py.models import loading

    folder = tiny_models.build(tmp_path / family, tiny_models.FAMILIES[family])
    loaded = loading.load(loading.resolve(str(folder)))
    assert loaded.weights.mode == "f32" and loaded.weights.kernel_layers == 0
    if QMM is not None:
        assert loaded.weights.note.startswith("row-exact kernel not used: "), loaded.weights.note
    assert all(p.dtype == mx.float32 for _, p in _flat(loaded.model))
    assert "row-exact attention" not in loaded.kernels


def _flat(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


@needs_kernel
@pytest.mark.parametrize("mode,bits", [("q8", (8,)), ("q4", (4,))])
def test_quantized_modes_on_a_float_model(tiny_dir, mode, bits):
    from mlxcel_py.models import loading

    loaded = loading.load(loading.resolve(str(tiny_dir)), cpu_weights=mode)
    w = loaded.weights
    assert w.bits == bits and w.kernel_layers > 0 and w.float_layers == 0 and not w.inexact
    kinds = {type(m).__name__ for _, m in loaded.model.named_modules()}
    assert "RowExactLinear" in kinds and "RowExactEmbedding" in kinds  # tied embeddings: the output layer too
    assert "row-exact attention" in loaded.kernels
    f32 = loading.load(loading.resolve(str(tiny_dir)), cpu_weights="f32")
    assert f32.weights.mode == "f32" and w.weight_bytes < f32.weights.weight_bytes / 3
    # the same logits up to the quantization error (random weights: 8 bits lose little, 4 bits of a
    # random Gaussian matrix a lot; the real model's figures are in the README), and row-exact
    ids = mx.array([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    a, b = loaded.model(ids), f32.model(ids)
    rel = (mx.abs(a - b).max() / mx.abs(b).max()).item()
    assert rel < (0.1 if 8 in bits else 1.0), rel
    if 8 in bits:
        assert (a.argmax(-1) == b.argmax(-1)).mean().item() >= 0.75
    assert _block_vs_steps(loaded.model, [7, 8, 9, 10], [11, 12, 13, 14, 15]) == [True] * 5


def _as_dtype(src, dst, dtype):
    """A copy of model folder `src` with its weights stored as `dtype`."""
    import shutil

    shutil.copytree(src, dst)
    w = mx.load(str(dst / "model.safetensors"))
    mx.save_safetensors(str(dst / "model.safetensors"), {k: v.astype(dtype) for k, v in w.items()})
    return dst


@needs_kernel
@pytest.mark.parametrize("dtype,form", [(mx.float32, "f32"), (mx.float16, "f16"), (mx.bfloat16, "bf16")])
def test_auto_keeps_a_float_model_in_its_own_precision(tiny_dir, tmp_path, dtype, form):
    """auto puts a float model's layers on the float kernel as stored (no 8-bit rounding): its
    greedy output is the float32 path's, its logits that path's up to summation order, its rows
    exact, and a float16 or bfloat16 model reads half the bytes."""
    from mlxcel_py.models import loading

    folder = _as_dtype(tiny_dir, tmp_path / form, dtype)
    loaded = loading.load(loading.resolve(str(folder)))
    w = loaded.weights
    assert (w.mode, w.forms, w.bits) == (form, (form,), ())
    assert w.kernel_layers > 0 and w.float_layers == 0 and not w.inexact
    layers = [m for _, m in loaded.model.named_modules() if isinstance(m, cpu_layers.RowExactFloatLinear)]
    assert {type(m).__name__ for m in layers} == {"RowExactFloatLinear", "RowExactFloatEmbedding"}
    assert {m.weight.dtype for m in layers} == {dtype}
    assert "2 fused decoder layers" in loaded.kernels
    f32 = loading.load(loading.resolve(str(folder)), cpu_weights="f32")
    if dtype != mx.float32:
        assert w.weight_bytes < 0.6 * f32.weights.weight_bytes
    ids = mx.array([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    a, b = loaded.model(ids), f32.model(ids)
    assert (mx.abs(a - b).max() / mx.abs(b).max()).item() < 1e-5
    prompt = list(range(40, 80))
    assert (
        run(engine_for(loaded), prompt, max_tokens=24, ignore_eos=True)[0]
        == run(engine_for(f32), prompt, max_tokens=24, ignore_eos=True)[0]
    )
    assert _block_vs_steps(loaded.model, [7, 8, 9, 10], [11, 12, 13, 14, 15]) == [True] * 5


@needs_kernel
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_the_float_kernel_is_row_exact_and_reads_its_rows_back(dtype):
    mx.random.seed(2)
    for n, k in ((40, 64), (33, 100), (576, 576)):  # a partial last group, an odd width
        w = (mx.random.normal((n, k)) * 0.1).astype(dtype)
        packed = QMM.float_repack(w)
        assert packed.shape == ((n + 15) // 16, k, 16) and packed.dtype == dtype
        x = mx.random.normal((13, k))
        y = QMM.row_exact_fmm(x, packed, n)
        assert mx.allclose(y, x @ w.astype(mx.float32).T, atol=1e-4).item()
        for i in range(13):
            assert mx.array_equal(QMM.row_exact_fmm(x[i : i + 1], packed, n)[0], y[i]).item()
        a, b = QMM.row_exact_fmm_multi(x[2:9], [packed, packed], [n, n])
        assert mx.array_equal(a, y[2:9]).item() and mx.array_equal(b, y[2:9]).item()
        ids = mx.array([0, n - 1, 5])
        assert mx.array_equal(QMM.float_rows(packed, n, ids), w.astype(mx.float32)[ids]).item()
        assert mx.array_equal(QMM.float_rows(packed, n), w.astype(mx.float32)).item()
    with pytest.raises(ValueError, match="from float_repack"):
        QMM.row_exact_fmm(mx.zeros((1, 64)), packed, n)  # k 576, not 64
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        QMM.float_repack(mx.zeros((16, 16), dtype=mx.int32))


@needs_kernel
@pytest.mark.parametrize("bits,half", [(4, False), (4, True), (8, False), (8, True)])
def test_symmetric_weights_without_biases_give_the_same_bits(bits, half):
    """Biases that are the scales times -2^(bits-1) (a GGUF's Q4_0 and Q8_0) need not be stored:
    the kernel's product, the lookup and the wide-block dequantization give the stored ones' bits."""
    w, s, _, _ = _quantized(96, 256, bits)
    if half:
        s = s.astype(mx.float16)
    stored = (s.astype(mx.float32) * (-8.0 if bits == 4 else -128.0)).astype(s.dtype)
    none = mx.zeros((0,), dtype=s.dtype)
    for m in (1, 5, 20):
        x = mx.random.normal((m, 256))
        assert mx.array_equal(QMM.row_exact_qmm(x, w, s, none, bits), QMM.row_exact_qmm(x, w, s, stored, bits)).item()
    ids = mx.array([0, 17, 95])
    assert mx.array_equal(
        QMM.dequantize_rows(w, s, none, bits, ids), QMM.dequantize_rows(w, s, stored, bits, ids)
    ).item()
    assert mx.array_equal(QMM.dequantize_rows(w, s, none, bits), QMM.dequantize_rows(w, s, stored, bits)).item()
    with pytest.raises(ValueError, match="empty biases: symmetric"):
        QMM.row_exact_qmm(x, w, s, stored[:, :1], bits)


@needs_kernel
def test_a_q4_0_gguf_drops_its_biases_and_decodes_the_same(tmp_path, monkeypatch):
    import gguf_files
    from gguf.constants import GGMLQuantizationType as Q

    from mlxcel_py.models import loading

    path = tmp_path / "m.gguf"
    gguf_files.write(path, "llama", [Q.Q4_0, Q.Q8_0])
    loaded = loading.load(loading.resolve(str(path)))
    sym = [
        m for _, m in loaded.model.named_modules() if isinstance(m, cpu_layers.RowExactLinear) and m.biases.size == 0
    ]
    assert len(sym) == loaded.weights.kernel_layers  # every Q4_0 and Q8_0 layer
    prompt = list(range(40, 70))
    got = run(engine_for(loaded), prompt, max_tokens=24, ignore_eos=True)[0]
    monkeypatch.setenv("MLXCEL_STORED_BIASES", "1")
    stored = loading.load(loading.resolve(str(path)))
    assert stored.weights.weight_bytes > loaded.weights.weight_bytes
    assert run(engine_for(stored), prompt, max_tokens=24, ignore_eos=True)[0] == got


@needs_kernel
@pytest.mark.real
def test_default_model_keeps_its_file_bits_and_shrinks(real):
    w = real.weights
    assert w.mode == "mixed" and w.bits == (4, 8)  # Q4_1 layers 4-bit, the Q8_0 tied embedding 8-bit
    assert w.weight_bytes < 130 * 2**20  # float32 was 540 MB
    assert w.as_json()["rows_exact"] is True


def test_kernel_can_be_turned_off_and_everything_still_runs(tiny_dir, cli_env):
    from test_cli_generate import mlxcel

    env = dict(cli_env, MLXCEL_NO_KERNEL="1")
    r = mlxcel(["generate", "-m", str(tiny_dir), "-p", "hello", "-n", "8", "--prompt-lookup", "--verbose"], env)
    assert r.returncode == 0, r.stderr
    assert "weights f32 (turned off by MLXCEL_NO_KERNEL)" in r.stderr


def test_sampling_is_unchanged_by_the_mode_flag_parsing():
    # --cpu-weights only picks weights: the sampling defaults of generate stay greedy
    from mlxcel_py.commands._options import build_options

    opts = build_options("generate", {"cpu_weights": "q4", "prompt": "x"})
    assert opts.model.cpu_weights == "q4" and opts.sampling == SamplingOptions()


def test_nn_layers_survive_a_mode_that_leaves_them_alone():
    # a float layer the quantized kernel cannot take (inputs not a multiple of 64) is reported, not
    # converted; under auto the float kernel takes any width
    lin = nn.Linear(32, 16)
    assert cpu_weights._target(lin, "q8") is None
    assert cpu_weights._target(nn.Linear(64, 16), "q4") == 4
    assert cpu_weights._target(lin, "auto") == cpu_weights._target(nn.Linear(64, 16), "auto") == cpu_weights.FLOAT


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_float16_scales_give_the_float32_rows_bit_for_bit(bits):
    """Scales and biases that are exactly float16 values (a GGUF's) may be held as float16: the
    kernel, the embedding lookup and the wide-block dequantization read the same float32 values."""
    mx.random.seed(5)
    w = (mx.random.normal((96, 256)) * 0.05).astype(mx.float16)
    wq, s, b = mx.quantize(w, group_size=32, bits=bits)
    assert s.dtype == mx.float16
    packed = QMM.repack(wq, bits)
    s32, b32 = QMM.interleave(s.astype(mx.float32)), QMM.interleave(b.astype(mx.float32))
    s16, b16 = s32.astype(mx.float16), b32.astype(mx.float16)
    x = mx.random.normal((5, 256))
    full = QMM.row_exact_qmm(x, packed, s32, b32, bits)
    half = QMM.row_exact_qmm(x, packed, s16, b16, bits)
    assert mx.array_equal(full, half).item()
    ids = mx.array([0, 17, 95, 3])
    assert mx.array_equal(
        QMM.dequantize_rows(packed, s32, b32, bits, ids), QMM.dequantize_rows(packed, s16, b16, bits, ids)
    ).item()
    with pytest.raises(ValueError, match="float16"):
        QMM.row_exact_qmm(x, packed, s16, b32, bits)  # one of each: refused


@needs_kernel
def test_half_scales_only_where_every_value_is_exact(tiny_dir, monkeypatch):
    from mlxcel_py.models import loading

    # float32 weights quantized here: float32 scales
    loaded = loading.load(loading.resolve(str(tiny_dir)), cpu_weights="q8")
    kinds = {m.scales.dtype for _, m in loaded.model.named_modules() if isinstance(m, cpu_layers.RowExactLinear)}
    assert kinds == {mx.float32}
    layer = next(m for n, m in loaded.model.named_modules() if n.endswith("o_proj"))  # no shared-input siblings
    x = mx.random.normal((3, layer.input_dims))
    before = layer(x)
    layer.scales = layer.scales.astype(mx.float16).astype(mx.float32)  # now exactly float16 values
    layer.biases = layer.biases.astype(mx.float16).astype(mx.float32)
    rounded = layer(x)
    assert cpu_weights.half_scales(loaded.model) == 1
    assert layer.scales.dtype == mx.float16 and mx.array_equal(layer(x), rounded).item()
    assert not mx.array_equal(before, rounded).item()  # the rounding was real, and kept as is
    monkeypatch.setenv("MLXCEL_F32_SCALES", "1")
    layer.scales = layer.scales.astype(mx.float32)
    assert cpu_weights.half_scales(loaded.model) == 0


@needs_kernel
@pytest.mark.real
def test_default_model_holds_its_gguf_scales_as_float16(real):
    layers = [m for _, m in real.model.named_modules() if isinstance(m, cpu_layers.RowExactLinear)]
    assert layers and all(m.scales.dtype == mx.float16 and m.biases.dtype == mx.float16 for m in layers)


@needs_kernel
def test_huge_page_arena_copies_exactly_and_unmaps_when_the_last_array_goes():
    import gc

    gc.collect()  # models earlier tests left behind would unmap their arenas mid-test
    before = QMM.huge_pages_bytes()
    src = [
        mx.arange(300_000, dtype=mx.float32),
        mx.random.randint(0, 255, (777, 129)).astype(mx.uint8),
        mx.array([1.5], dtype=mx.float16),
    ]
    copies, size, huge = QMM.to_huge_pages(src)
    assert size >= sum(a.nbytes for a in src) and size % (2 << 20) == 0
    assert 0 <= huge <= size
    assert QMM.huge_pages_bytes() - before >= size
    for a, b in zip(src, copies):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        assert mx.array_equal(a, b).item()
    del a, b
    assert (copies[0] * 2).sum().item() == (src[0] * 2).sum().item()  # MLX reads the arena like its own buffers
    keep = copies[1]
    del copies
    gc.collect()
    assert QMM.huge_pages_bytes() - before >= size  # one array still holds the arena
    assert mx.array_equal(keep, src[1]).item()
    del keep
    gc.collect()
    assert QMM.huge_pages_bytes() == before
    assert QMM.to_huge_pages([]) == ([], 0, 0)


@needs_kernel
def test_weights_in_huge_pages_decode_the_same_and_count_in_peak_memory(tiny_dir, monkeypatch):
    import gc

    from mlxcel_py.models import loading

    prompt = list(range(40, 70))
    loaded = loading.load(loading.resolve(str(tiny_dir)))
    layers = [m for _, m in loaded.model.named_modules() if isinstance(m, cpu_layers.KERNEL_LINEARS)]
    assert layers and QMM.huge_pages_bytes() >= sum(m.weight.nbytes for m in layers)
    got, g = run(engine_for(loaded), prompt, max_tokens=24, ignore_eos=True)
    assert g.stats.peak_memory_bytes >= QMM.huge_pages_bytes()  # MLX's counters alone miss the arena
    monkeypatch.setenv("MLXCEL_NO_HUGE_PAGES", "1")
    gc.collect()
    gc.disable()  # no other test's model may unmap its arena in between
    try:
        arena = QMM.huge_pages_bytes()
        plain = loading.load(loading.resolve(str(tiny_dir)))
        assert QMM.huge_pages_bytes() == arena  # nothing moved this time
    finally:
        gc.enable()
    assert run(engine_for(plain), prompt, max_tokens=24, ignore_eos=True)[0] == got


def test_a_thread_count_that_is_not_a_plain_number_is_ignored(monkeypatch):
    from mlxcel_py.cpu.cores import usable_cores

    for bad in ("²", "two", "-1", "0", ""):
        monkeypatch.setenv("MLXCEL_KERNEL_THREADS", bad)
        assert cpu_extension.default_threads() == usable_cores()
    monkeypatch.setenv("MLXCEL_KERNEL_THREADS", "3")
    assert cpu_extension.default_threads() == 3

"""Attention over long contexts in key chunks (csrc/attention_kernel.cpp, KEY_CHUNK = 1024).

A query with more than 1,024 visible keys is computed chunk by chunk (each its own max, exp sum
and weighted values) and merged in chunk order, so the threads can split one query's keys. The
chunks depend on the visible keys alone: every row must still equal its one-row call bit for
bit, whatever the thread count, and agree with MLX's attention to rounding.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxcel_py.cpu import extension as cpu_extension

QMM, WHY = cpu_extension.kernel_status()
needs_kernel = pytest.mark.skipif(QMM is None, reason=f"row-exact kernel: {WHY}")


def _with_threads(n: int, fn, *args):
    before = QMM.threads()
    QMM.set_threads(n)
    try:
        out = fn(*args)
        mx.eval(out)
        return out
    finally:
        QMM.set_threads(before)


@needs_kernel
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("kv_type", [mx.float32, mx.float16])
def test_long_rows_match_mlx_and_each_row_its_own_call_on_any_thread_count(dim, kv_type):
    from mlx_lm.models.base import scaled_dot_product_attention as sdpa

    mx.random.seed(21)
    s_len, length = 3000, 6  # rows see 2,995..3,000 keys: three chunks, the last partial
    q = mx.random.normal((1, 6, length, dim))
    k = mx.random.normal((1, 2, s_len, dim)).astype(kv_type)
    v = mx.random.normal((1, 2, s_len, dim)).astype(kv_type)
    one = _with_threads(1, QMM.row_exact_attention, q, k, v, 0.125, True)
    two = _with_threads(2, QMM.row_exact_attention, q, k, v, 0.125, True)
    assert mx.array_equal(one, two).item()
    want = sdpa(q, k.astype(mx.float32), v.astype(mx.float32), None, scale=0.125, mask="causal")
    assert mx.allclose(one, want, atol=1e-5, rtol=1e-4).item()
    for i in range(length):
        visible = s_len - length + i + 1
        row = _with_threads(
            2, QMM.row_exact_attention, q[:, :, i : i + 1], k[:, :, :visible], v[:, :, :visible], 0.125, False
        )
        assert mx.array_equal(row, one[:, :, i : i + 1]).item(), i


@needs_kernel
def test_a_chunk_boundary_row_equals_the_single_pass():
    # exactly 1,024 keys is one chunk: the result is the single pass's (acc / l), and 1,025 keys
    # (two chunks) still agrees with MLX to rounding
    from mlx_lm.models.base import scaled_dot_product_attention as sdpa

    mx.random.seed(4)
    q = mx.random.normal((1, 3, 1, 64))
    k, v = mx.random.normal((1, 1, 1025, 64)), mx.random.normal((1, 1, 1025, 64))
    for keys in (1024, 1025):
        got = QMM.row_exact_attention(q, k[:, :, :keys], v[:, :, :keys], 0.125, False)
        want = sdpa(q, k[:, :, :keys], v[:, :, :keys], None, scale=0.125, mask=None)
        assert mx.allclose(got, want, atol=1e-6, rtol=1e-5).item(), keys


@needs_kernel
def test_batched_long_sequences_split_by_keys_equal_their_own_attention():
    mx.random.seed(8)
    heads, kv, dim = 9, 3, 64
    offsets, lengths = [2100, 40, 1500], [1, 3, 1]
    kbufs = [mx.random.normal((1, kv, o + n + 4, dim)).astype(mx.float16) for o, n in zip(offsets, lengths)]
    vbufs = [mx.random.normal((1, kv, o + n + 4, dim)).astype(mx.float16) for o, n in zip(offsets, lengths)]
    seq = [b for b, n in enumerate(lengths) for _ in range(n)]
    pos = [o + i for o, n in zip(offsets, lengths) for i in range(n)]
    q = mx.random.normal((len(seq), heads, 1, dim))
    k_new, v_new = mx.random.normal((len(seq), kv, 1, dim)), mx.random.normal((len(seq), kv, 1, dim))
    got = _with_threads(2, QMM.row_exact_cache_attention, q, k_new, v_new, kbufs, vbufs, seq, pos, 0.125)
    for e, (b, p) in enumerate(zip(seq, pos)):
        kb, vb = got[1 + b], got[1 + len(lengths) + b]
        want = _with_threads(
            1, QMM.row_exact_attention, q[e : e + 1], kb[:, :, : p + 1], vb[:, :, : p + 1], 0.125, False
        )
        assert mx.array_equal(got[0][e : e + 1], want).item(), (e, b, p)


@needs_kernel
@pytest.mark.real
def test_default_model_block_rows_equal_steps_after_a_long_prompt(real):
    from mlxcel_py.engine.cache import SequenceCache

    prompt = real.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 140)  # ~1,400 tokens
    assert len(prompt) > 1100
    block = [17, 99, 512, 1000, 42, 7]

    def fed() -> SequenceCache:
        c = SequenceCache(real.model)
        c.prefill(prompt)
        return c

    steps = fed()
    one_by_one = mx.stack([steps.feed([t])[0] for t in block])
    assert mx.array_equal(fed().feed(block), one_by_one).item()

"""The vectorized-exp CPU kernels: numerics against MLX's own, and where they apply."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import activations, base
from test_engine import drafters_for

from mlxcel_py.cpu import kernels as cpu_kernels
from mlxcel_py.engine.engine import Engine
from mlxcel_py.models import loading
from mlxcel_py.options import DraftConfig, LookupConfig, SamplingOptions


def test_exp_within_an_ulp_or_two_of_mlx_and_zero_where_mlx_is_zero():
    x = mx.linspace(-87.0, 88.0, 100_001)
    got, want = cpu_kernels.exp(x), mx.exp(x)
    rel = (mx.abs(got - want) / want).max().item()
    assert rel < 2.5e-7  # float32 ulp is 1.19e-7 relative
    edges = mx.array([-mx.inf, -1e30, -200.0, -88.5, 0.0, -1e-30])
    assert cpu_kernels.exp(edges).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert cpu_kernels.self_check() is None


@pytest.mark.parametrize("length,keys_len,mask", [(1, 37, None), (5, 40, "causal"), (9, 9, "causal"), (3, 200, None)])
def test_attention_matches_mlx_sdpa(length, keys_len, mask):
    mx.random.seed(3)
    q = mx.random.normal((1, 6, length, 16)) * 2
    k = mx.random.normal((1, 2, keys_len, 16)) * 2
    v = mx.random.normal((1, 2, keys_len, 16))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = cpu_kernels.attention(q, k, v, 0.25, mask)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=2e-6, rtol=1e-5).item()


def test_swiglu_matches_mlx():
    mx.random.seed(4)
    g, x = mx.random.normal((1, 7, 96)) * 6, mx.random.normal((1, 7, 96))
    assert mx.allclose(cpu_kernels.silu_times(g, x), nn.silu(g) * x, atol=1e-6, rtol=1e-6).item()


def test_compiled_traces_are_bounded():
    calls = []
    c = cpu_kernels._Compiled(lambda a: calls.append(a.shape) or a + 1, limit=3)
    first = c._compiled
    for n in range(1, 4):
        c(mx.zeros((n,)))
    assert c._compiled is first
    c(mx.zeros((4,)))  # a fourth shape starts a fresh compiled function
    assert c._compiled is not first and len(c._shapes) == 1
    assert c(mx.zeros((2,))).tolist() == [1.0, 1.0]


def test_dispatch_only_inside_engaged_for_an_enabled_model(tiny_dir, monkeypatch):
    """Stock mlx-lm in the same process keeps mlx-lm's kernels; the engine's forwards use ours."""
    import mlx_lm.models.llama as llama_module

    from mlxcel_py.models import loading

    # float32 weights: with the row-exact ones, attention goes to their one-row kernel instead
    tiny = loading.load(loading.resolve(str(tiny_dir)), cpu_weights="f32")
    assert tiny.kernels == cpu_kernels.FAST
    assert llama_module.scaled_dot_product_attention is cpu_kernels.scaled_dot_product_attention
    assert llama_module.swiglu is cpu_kernels.swiglu
    used = []
    real_attention, real_silu = cpu_kernels.attention, cpu_kernels.silu_times
    monkeypatch.setattr(cpu_kernels, "attention", lambda *a: used.append("attention") or real_attention(*a))
    monkeypatch.setattr(cpu_kernels, "silu_times", lambda *a: used.append("swiglu") or real_silu(*a))
    tokens = mx.array([[5, 6, 7, 8]])
    outside = tiny.model(tokens)
    assert used == []
    with cpu_kernels.engaged(tiny.model):
        inside = tiny.model(tokens)
    assert "attention" in used and "swiglu" in used
    assert mx.allclose(inside, outside, atol=1e-4).item()
    # prefill-sized blocks keep mlx-lm's functions (peak memory)
    used.clear()
    with cpu_kernels.engaged(tiny.model):
        mx.eval(tiny.model(mx.array([list(range(cpu_kernels.MAX_ROWS + 1))])))
    assert used == []
    # a model loaded with --no-fast-kernels never engages them
    stock = loading.load(loading.resolve(str(tiny_dir)), fast_kernels=False, cpu_weights="f32")
    assert stock.kernels == cpu_kernels.STOCK
    used.clear()
    with cpu_kernels.engaged(stock.model):
        stock.model(tokens)
    assert used == []
    # and the originals are what runs outside: mlx-lm's functions, untouched
    assert cpu_kernels._MLX_ATTENTION is base.scaled_dot_product_attention
    assert cpu_kernels._MLX_SWIGLU is activations.swiglu


def test_same_greedy_tokens_with_and_without_fast_kernels_and_speculation(tiny, tiny_dir):
    """Kernels change the last bits of a float, not what a tiny model decodes: all four agree."""
    stock = loading.load(loading.resolve(str(tiny_dir)), fast_kernels=False)
    draft = DraftConfig(kind="prompt-lookup", lookup=LookupConfig(max_draft=6))
    prompt = [40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40, 41]
    outs = []
    for loaded in (tiny, stock):
        eng = Engine(
            loaded.model,
            eos_ids=[],
            vocab_size=260,
            drafters=drafters_for(draft, loaded.model, eos_ids=[], vocab_size=260),
        )
        for spec in (False, True):
            gen = eng.generate(prompt, max_tokens=40, sampling=SamplingOptions(), speculative=spec)
            outs.append([e.token for e in gen])
    assert outs[0] == outs[1] == outs[2] == outs[3]
    assert len(outs[0]) == 40

"""CPU kernels for attention and SwiGLU that avoid MLX's scalar exp.

Why: on x86 the `mlx[cpu]` wheel evaluates exp (inside softmax and sigmoid) one element at a time
through a software fma, about 12 ns per element against 0.2 ns for an add. A verify block
multiplies those exps by its width (and attention's by the context length), so on the default
model a width-8 verify spent about a third of its extra cost over a plain step in exp.

What: exp is MLX's own Cephes polynomial (mlx/backend/cpu/simd/math.h: x*log2(e) = n + f,
2^n * P(f)) written as elementwise ops that `mx.compile` fuses; it stays within about 1 ulp of
`mx.exp`, and is exactly 0 where MLX's is. Attention folds the query heads that share a KV head
into the rows of one matmul; SwiGLU is silu(gate) * x with the same exp.

Row-exact attention: with the row-exact quantized weights (cpu_weights), `enable_row_exact`
routes attention over decode and verify blocks to the extension's one-row-at-a-time attention,
whether or not these kernels are on (see that function for why), and SwiGLU to the extension's
vectorised one (any number of rows); cpu_weights.patch_rope gives the model's rope modules the
extension's rope.

Where: `enable(model)` puts dispatchers into the model's mlx-lm module (its
`scaled_dot_product_attention` and `swiglu` names). They run these kernels only inside
`engaged(model)` for an enabled model, which the engine's forwards use, and mlx-lm's own functions
everywhere else (stock mlx-lm in the same process is unchanged). Plain decoding and verification
share the kernels, so greedy speculative output still equals plain output. Anything these kernels
do not cover (array masks, attention sinks, quantized KV caches, dtypes other than float32) goes to
mlx-lm's functions, and so do blocks of more than MAX_ROWS positions (prefill chunks): with the
fused kernels' intermediates a 1200-token prefill of the default model peaked at 2.8x mlx-lm's
memory above the weights, for a cost paid once per prompt.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.models import activations as _activations
from mlx_lm.models import base as _base

from ..options import MAX_DRAFT_LIMIT

FAST = "vectorized exp (attention softmax, SwiGLU)"
STOCK = "mlx-lm's"
MAX_ROWS = MAX_DRAFT_LIMIT + 1  # the widest verify block; decode steps are 1 row

_MLX_ATTENTION = _base.scaled_dot_product_attention
_MLX_SWIGLU = _activations.swiglu

# 2^f on [-1/2, 1/2], highest power first: the coefficients of MLX's CPU exp
_EXP2_POLY = (
    1.535336188319500e-4,
    1.339887440266574e-3,
    9.618437357674640e-3,
    5.550332471162809e-2,
    2.402264791363012e-1,
    6.931472028550421e-1,
    1.0,
)
# adding 1.5 * 2^23 rounds a float32 of magnitude below 2^22 to an integer held in the low
# mantissa bits: one add instead of floor(x + 0.5), which made the fused kernel 1.5x slower here
_ROUND = 12582912.0
_ROUND_BITS = 0x4B400000


def _exp(x: mx.array) -> mx.array:
    # exp(-88) is below float32's smallest normal: n = -127 there gives an exponent field of 0,
    # so the result is exactly 0, like MLX's (which returns 0 below -88); 88 stays finite
    x = mx.clip(x, -88.0, 88.0)
    y = x * 1.442695
    r = y + _ROUND
    f = y - (r - _ROUND)
    p = _EXP2_POLY[0]
    for c in _EXP2_POLY[1:]:
        p = p * f + c
    two_n = ((r.view(mx.int32) - (_ROUND_BITS - 127)) << 23).view(mx.float32)
    return two_n * p


def _silu_times(gate: mx.array, x: mx.array) -> mx.array:
    return gate * (1.0 / (1.0 + _exp(-gate))) * x


class _Compiled:
    """`mx.compile` keeps one trace per input shape for the life of the compiled function, and
    the key length grows every decode step; start a fresh one after `limit` shapes."""

    def __init__(self, fn: Callable[..., mx.array], limit: int = 512):
        self._fn, self._limit = fn, limit
        self._reset()

    def _reset(self) -> None:
        self._compiled = mx.compile(self._fn)
        self._shapes: set[tuple] = set()

    def __call__(self, *args: mx.array) -> mx.array:
        key = tuple(a.shape for a in args)
        if key not in self._shapes:
            if len(self._shapes) >= self._limit:
                self._reset()
            self._shapes.add(key)
        return self._compiled(*args)


exp = _Compiled(_exp)
silu_times = _Compiled(_silu_times)


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any) -> mx.array:
    """softmax(q k^T * scale [+ causal mask]) v for (B, heads, L, D) queries and (B, kv_heads, S, D)
    keys/values; mask is None or "causal" (row i sees keys up to S - L + i)."""
    b, n_q, length, dim = queries.shape
    n_kv, keys_len = keys.shape[1], keys.shape[2]
    group = n_q // n_kv
    # the query heads sharing one KV head become rows of one matmul (heads are grouped per KV
    # head, as in MLX's own GQA fallback)
    q = (queries * scale).reshape(b, n_kv, group * length, dim)
    scores = q @ keys.swapaxes(-1, -2)
    if mask is not None:
        visible = mx.arange(keys_len - length, keys_len)[:, None] >= mx.arange(keys_len)[None]
        scores = mx.where(visible, scores.reshape(b, n_kv, group, length, keys_len), -mx.inf)
        scores = scores.reshape(b, n_kv, group * length, keys_len)
    # subtracting the row max outside the fused exp keeps that kernel's input contiguous
    e = exp(scores - scores.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    return (probs @ values).reshape(b, n_q, length, dim)


# -- dispatch ------------------------------------------------------------------------------------
_local = threading.local()
_enabled: dict[int, tuple[bool, Callable | None]] = {}  # id(model) -> (fast kernels, row-exact attention)
_row_swiglu: dict[int, Callable] = {}  # id(model) -> the row-exact path's SwiGLU


def _engaged_now() -> bool:
    return getattr(_local, "on", False)


def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's signature; these kernels inside `engaged`, mlx-lm's otherwise."""
    attend_rows = getattr(cache, "attend_rows", None)
    if attend_rows is not None:  # a batched forward (batch.RowCaches): each row over its own sequence
        return attend_rows(queries, keys, values, scale, mask, sinks, _ours(queries, cache, mask, sinks))
    if _ours(queries, cache, mask, sinks):
        exact = getattr(_local, "exact", None)
        if exact is not None:  # the row-exact weights' companion: see enable_row_exact
            return exact(queries, keys, values, scale, mask is not None)
        if getattr(_local, "fast", False):
            return attention(queries, keys, values, scale, mask)
    return _MLX_ATTENTION(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


def _ours(queries, cache, mask, sinks) -> bool:
    """Whether these kernels cover this call (inside `engaged`): float32 blocks of up to MAX_ROWS
    rows, no sinks, no quantized cache, no mask or the causal one."""
    return (
        _engaged_now()
        and queries.shape[2] <= MAX_ROWS
        and sinks is None
        and not hasattr(cache, "bits")
        and queries.dtype == mx.float32
        and (mask is None or (isinstance(mask, str) and mask == "causal"))
    )


def row_exact_now() -> bool:
    """Whether attention inside this `engaged` block is the row-exact one (enable_row_exact)."""
    return _engaged_now() and getattr(_local, "exact", None) is not None


def swiglu(gate, x):
    row = getattr(_local, "swiglu", None)
    if row is not None and _engaged_now() and gate.dtype == mx.float32 and x.dtype == mx.float32:
        return row(gate, x)  # the row-exact path's own (enable_row_exact)
    if (
        _engaged_now()
        and getattr(_local, "fast", False)
        and gate.shape[-2] <= MAX_ROWS
        and gate.dtype == mx.float32
        and x.dtype == mx.float32
    ):
        return silu_times(gate, x)
    return _MLX_SWIGLU(gate, x)


_DISPATCH = {
    "scaled_dot_product_attention": (_MLX_ATTENTION, scaled_dot_product_attention),
    "swiglu": (_MLX_SWIGLU, swiglu),
}


def self_check() -> str | None:
    """None when the fused exp matches mx.exp here (a JIT compiler that reassociated the rounding
    add would break it); otherwise why not."""
    try:
        x = mx.concatenate([mx.linspace(-87.0, 88.0, 20001), mx.array([-mx.inf, -200.0, -88.5, 0.0])])
        got, want = exp(x), mx.exp(x)
        rel = (mx.abs(got[:-4] - want[:-4]) / want[:-4]).max().item()
        zeros_ok = bool((got[-4:-1] == 0).all().item()) and got[-1].item() == 1.0
    except Exception as exc:  # anything that keeps the kernels from building or running
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    if rel > 4e-7 or not zeros_ok:
        return f"fused exp differs from mx.exp (relative error {rel:.1e})"
    return None


@functools.cache
def _unavailable() -> str | None:
    return self_check()  # once per process: the JIT and its compiler do not change


def routes_attention(model: Any) -> bool:
    """Whether `model`'s module calls mlx-lm's attention by name (so a dispatcher can stand in)."""
    current = getattr(sys.modules.get(type(model).__module__), "scaled_dot_product_attention", None)
    return current is _MLX_ATTENTION or current is scaled_dot_product_attention


def install_dispatch(model: Any) -> bool:
    """Route the model module's attention through `scaled_dot_product_attention` here (batched
    steps need it whether or not these kernels are on); False if the module has no such name."""
    return _install(model)


def _install(model: Any) -> bool:
    # a wrapper that runs a text model (a vision model's decoder) names it: the attention is its
    model = getattr(model, "kernel_model", model)
    module = sys.modules.get(type(model).__module__)
    installed = False
    for name, (original, dispatcher) in _DISPATCH.items():
        current = getattr(module, name, None)
        if current is original:
            setattr(module, name, dispatcher)
        installed |= getattr(module, name, None) is dispatcher
    return installed


def _register(model: Any, fast: bool | None = None, exact: Callable | None = None) -> None:
    key = id(model)
    was_fast, was_exact = _enabled.get(key, (False, None))
    if key not in _enabled:
        weakref.finalize(model, _enabled.pop, key, None)
        weakref.finalize(model, _row_swiglu.pop, key, None)
    _enabled[key] = (was_fast if fast is None else fast, exact or was_exact)


def alias(model: Any, runs: Any) -> None:
    """`model`'s forwards are `runs`' (a wrapper around it: a vision model's text decoder), so
    `engaged(model)` engages what was enabled for `runs`."""
    if id(runs) in _enabled:
        _register(model, *_enabled[id(runs)])
        if id(runs) in _row_swiglu:
            _row_swiglu[id(model)] = _row_swiglu[id(runs)]


def enable(model: Any) -> str:
    """Use these kernels for `model`'s forwards inside `engaged(model)`; returns what is in use."""
    if (why := _unavailable()) is not None:
        return f"{STOCK} (fast kernels unavailable: {why})"
    if not _install(model):  # an architecture that calls neither function by these names
        return STOCK
    _register(model, fast=True)
    return FAST


def enable_row_exact(model: Any, attention_fn: Callable, swiglu_fn: Callable | None = None) -> bool:
    """Route `model`'s attention over blocks of up to MAX_ROWS rows to `attention_fn(q, k, v,
    scale, causal)`, which computes each query row alone. The row-exact matmul (cpu_weights)
    needs it: its int8 activations turn the last-bit differences of a batched softmax into
    different logits, so every op of a verify block must give each row exactly what a decode
    step gives. `swiglu_fn(gate, x)`, if given, computes SwiGLU for any number of rows (an
    elementwise op is row-exact whatever computes it; this one is vectorised and one op). False
    when the architecture does not call mlx-lm's attention by name."""
    if not _install(model):
        return False
    _register(model, exact=attention_fn)
    if swiglu_fn is not None:
        _row_swiglu[id(model)] = swiglu_fn
    return True


def prefill_chunk(model: Any, default: int) -> int:
    """Prompt tokens per prefill forward. On the row-exact path, blocks of at most MAX_ROWS - 1
    stay on the kernel and the one-row attention, so every prompt position comes out the same
    whichever pieces the prompt was fed in (a prompt cache's suffix, a chat turn); measured faster
    than 512-row BLAS chunks too (1.5 s against 2.5 s for 500 tokens of the default model), which
    dequantize the weights for every chunk."""
    flags = _enabled.get(id(model))
    return min(default, MAX_ROWS - 1) if flags is not None and flags[1] is not None else default


def row_exact(model: Any) -> bool:
    """Whether `model`'s attention is the row-exact one (enable_row_exact)."""
    flags = _enabled.get(id(model))
    return flags is not None and flags[1] is not None


@contextmanager
def engaged(model: Any) -> Iterator[None]:
    """Build `model`'s forward graphs with these kernels if it was enabled."""
    flags = _enabled.get(id(model))
    if flags is None or _engaged_now():
        yield
        return
    _local.on, (_local.fast, _local.exact) = True, flags
    _local.swiglu = _row_swiglu.get(id(model))
    try:
        yield
    finally:
        _local.on, _local.fast, _local.exact, _local.swiglu = False, False, None, None

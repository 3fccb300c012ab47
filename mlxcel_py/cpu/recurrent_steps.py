"""Per-step recurrent states for Gated DeltaNet layers (Qwen3.5, Qwen3-Next): rollback by picking.

A checkpoint rolls a recurrent layer back by restoring its state from before the verify block and
replaying the kept tokens. For Gated DeltaNet there is a cheaper way on the CPU: mlx-lm's ops path
(`gated_delta_ops`) computes the recurrent state after every step of a block anyway, and the conv
state after step i is a slice of the conv input. While a block is recorded (`recording`), those
per-step states are kept, and a partial accept sets each layer's cache to the state after its last
kept token: no replay at all.

How: `enable(model)` puts a dispatcher into the model module's `gated_delta_update` name and makes
each layer's conv1d record its input. Outside `recording` (and for any model not enabled) the
dispatcher is mlx-lm's function. The recording version runs the same ops in the same order as
mlx-lm's CPU path (`_gated_delta_step_ops` per step), so outputs are bit-identical to plain
decoding. Only where mlx-lm would use its Metal kernel (GPU) is nothing enabled.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.models import gated_delta as _gd

_ORIGINAL = _gd.gated_delta_update
_local = threading.local()  # .records: list of (kind, value) in call order while recording


def _recording_update(
    q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel=True, lower_bound=None, allow_neg_eigval=False
):
    """mlx-lm's gated_delta_update on its ops path, keeping the state after every step."""
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    g = (
        _gd.compute_g(A_log, a, dt_bias)
        if lower_bound is None
        else _gd.compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    )
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    if (repeat := Hv // Hk) > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    ys, states = [], []
    for t in range(T):
        y, state = _gd._gated_delta_step_ops(
            q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state, None if mask is None else mask[:, t]
        )
        ys.append(y)
        states.append(state)
    _local.records.append(("states", states))
    return mx.stack(ys, axis=1), state


def _dispatch(*args, **kwargs):
    if getattr(_local, "records", None) is not None:
        return _recording_update(*args, **kwargs)
    return _ORIGINAL(*args, **kwargs)


_CONV: dict[type, type] = {}


def _recording_conv(conv: Any) -> None:
    base = type(conv)
    if base in _CONV.values():  # enabled already (one per model, however many caches)
        return
    if base not in _CONV:

        def call(self, x, _base=base):
            if getattr(_local, "records", None) is not None:
                _local.records.append(("conv", x))
            return _base.__call__(self, x)

        _CONV[base] = type(f"Recording{base.__name__}", (base,), {"__call__": call})
    conv.__class__ = _CONV[base]


def enable(model: Any) -> dict[int, int]:
    """Install the recorders for `model`'s Gated DeltaNet layers; returns {cache index: conv kernel
    size} for each of them (empty when the model has none or mlx-lm would use a GPU kernel)."""
    if mx.default_device() == mx.gpu and mx.metal.is_available():
        return {}
    layers = getattr(model, "layers", None) or []
    found = {}
    for i, layer in enumerate(layers):
        gdn = getattr(layer, "linear_attn", None)
        if gdn is None or not hasattr(gdn, "conv1d") or not hasattr(gdn, "conv_kernel_size"):
            continue
        module = sys.modules.get(type(gdn).__module__)
        current = getattr(module, "gated_delta_update", None)
        if current is _ORIGINAL:
            module.gated_delta_update = _dispatch
        elif current is not _dispatch:
            return {}  # a module that computes the recurrence some other way: checkpoint instead
        _recording_conv(gdn.conv1d)
        found[i] = gdn.conv_kernel_size
    return found


@contextmanager
def recording() -> Iterator[list]:
    """Inside, every enabled layer's forward appends ("conv", input) then ("states", [per step])."""
    outer = getattr(_local, "records", None)
    _local.records = []
    try:
        yield _local.records
    finally:
        _local.records = outer


def by_layer(records: list, indices: list[int]) -> dict[int, tuple[mx.array, list]]:
    """Pair the records of one forward with the enabled layers' cache indices, in call order."""
    convs = [v for kind, v in records if kind == "conv"]
    states = [v for kind, v in records if kind == "states"]
    assert len(convs) == len(states) == len(indices), "one record per Gated DeltaNet layer"
    return dict(zip(indices, zip(convs, states)))


def pick(cache: Any, record: tuple[mx.array, list], keep: int, kernel: int) -> None:
    """Set an ArraysCache to its state after the first `keep` tokens of the recorded block."""
    conv_input, states = record
    cache[0] = mx.contiguous(conv_input[:, keep : keep + kernel - 1, :])
    cache[1] = states[keep - 1]

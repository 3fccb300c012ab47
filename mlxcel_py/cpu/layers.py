"""The kernels' linear layers: quantized (`RowExactLinear`, its embedding) and float
(`RowExactFloatLinear`, its embedding), and `SharedInput`, siblings fed one input in one call.
`weights.apply` converts a model's layers into these.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..options import MAX_DRAFT_LIMIT
from .extension import kernel_status
from .row_ops import _row_count

MAX_ROWS = MAX_DRAFT_LIMIT + 1  # the widest verify block; decode steps are 1 row
# Blocks up to this many rows use the kernel (a batched step of many sequences' verify blocks
# reaches a few hundred); wider ones dequantize and use BLAS. Measured on this 2-core CPU: the
# kernel took 6.2 ms for 64 rows of a 49152 x 576 4-bit weight, about linear in the rows, where
# BLAS on float32 needs about 4x that at 256 rows before the dequantization.
KERNEL_ROWS = 256
GROUP = 32  # the group size of layers this module quantizes (GGUF's block size)
KERNEL_GROUPS = (32, 64, 128)


FLOAT_FORMS = {mx.float16: "f16", mx.bfloat16: "bf16", mx.float32: "f32"}  # the float kernel's


class _KernelLinear(nn.Module):
    """What the kernels' linear layers share: blocks of up to KERNEL_ROWS rows through the kernel
    (siblings fed the same input in one call: SharedInput), wider ones through BLAS on the
    weight read back as float32 (prefill-sized blocks: BLAS beats the row kernel there, measured
    2x at 512 rows; prefill is shared by plain and speculative runs, so exactness is unaffected),
    then the bias."""

    def _kernel(self, x: mx.array) -> mx.array:
        raise NotImplementedError

    def _dense(self) -> mx.array:
        raise NotImplementedError

    def _matmul(self, x: mx.array) -> mx.array:
        if _row_count(x) <= KERNEL_ROWS:
            shared = getattr(self, "_shared", None)
            return shared.output(self, x) if shared is not None else self._kernel(x)
        return x.astype(mx.float32) @ self._dense().T

    def __call__(self, x: mx.array) -> mx.array:
        y = self._matmul(x)
        return y + self["bias"] if "bias" in self else y


class RowExactLinear(_KernelLinear):
    """y = x @ W^T (+ bias) with W held in the kernel's layout: `weight` uint8 [N, K*bits/8] from
    `_qmm.repack`, `scales`/`biases` [N, K/32] in its order (`_qmm.interleave`), float32 or, where
    exact, float16 (`half_scales`); `biases` empty where they are the scales times -2^(bits-1)
    (`symmetric_biases`). Built by `apply`."""

    def __init__(self, weight: mx.array, scales: mx.array, biases: mx.array, bits: int, bias: mx.array | None = None):
        super().__init__()
        self.weight, self.scales, self.biases = weight, scales, biases
        if bias is not None:
            self.bias = bias
        self.bits = bits
        self.freeze()

    @property
    def input_dims(self) -> int:
        return self.weight.shape[1] * 8 // self.bits

    @property
    def n(self) -> int:
        """Output features."""
        return self.weight.shape[0]

    def _kernel(self, x: mx.array) -> mx.array:
        qmm, _ = kernel_status()
        return qmm.row_exact_qmm(x, self["weight"], self["scales"], self["biases"], self.bits)

    def _dense(self) -> mx.array:
        qmm, _ = kernel_status()
        return qmm.dequantize_rows(self["weight"], self["scales"], self["biases"], self.bits)

    def _extra_repr(self) -> str:
        return f"input_dims={self.input_dims}, output_dims={self.n}, bits={self.bits}, row-exact kernel"


class RowExactFloatLinear(_KernelLinear):
    """y = x @ W^T (+ bias) with W kept in its stored precision (float16, bfloat16 or float32) in
    the float kernel's layout: `weight` [ceil(N/16), K, 16] from `_qmm.float_repack`, `n` outputs.
    Built by `apply` (auto, for float layers)."""

    bits = 0  # not quantized (the fused decoder layer tells the two kinds apart by the weight's dtype)

    def __init__(self, weight: mx.array, n: int, bias: mx.array | None = None):
        super().__init__()
        self.weight = weight
        if bias is not None:
            self.bias = bias
        self.n = n
        self.freeze()

    @property
    def input_dims(self) -> int:
        return self.weight.shape[1]

    @property
    def form(self) -> str:
        return FLOAT_FORMS[self.weight.dtype]

    def _kernel(self, x: mx.array) -> mx.array:
        qmm, _ = kernel_status()
        return qmm.row_exact_fmm(x, self["weight"], self.n)

    def _dense(self) -> mx.array:
        qmm, _ = kernel_status()
        return qmm.float_rows(self["weight"], self.n)

    def _extra_repr(self) -> str:
        return f"input_dims={self.input_dims}, output_dims={self.n}, {self.form}, row-exact float kernel"


class RowExactFloatEmbedding(RowExactFloatLinear):
    """A float embedding in the float kernel's layout: lookups read the picked rows back (exact);
    `as_linear` (a tied output layer) is the row-exact float matmul."""

    def __call__(self, ids: mx.array) -> mx.array:
        qmm, _ = kernel_status()
        return qmm.float_rows(self["weight"], self.n, ids)

    def as_linear(self, x: mx.array) -> mx.array:
        return self._matmul(x)


KERNEL_LINEARS = (RowExactLinear, RowExactFloatLinear)  # the kernels' layer types (embeddings derive)


class SharedInput:
    """Sibling layers fed the same input (q/k/v, gate/up): the first call multiplies all of them
    in one kernel call (the input quantized once, one graph node instead of three); the others
    take their part. Each part is exactly what the layer alone would give (the kernel is the same
    per weight row), so this changes speed only. Members are all quantized with one bit width,
    or all float."""

    SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"))

    def __init__(self, members: list[RowExactLinear]):
        self.members = members
        self._x: mx.array | None = None
        self._outs: list[mx.array] = []
        self._left = 0

    def output(self, member: RowExactLinear, x: mx.array) -> mx.array:
        if self._x is not x or self._left == 0:
            qmm, _ = kernel_status()
            if isinstance(member, RowExactFloatLinear):
                self._outs = qmm.row_exact_fmm_multi(
                    x, [m["weight"] for m in self.members], [m.n for m in self.members]
                )
            else:
                self._outs = qmm.row_exact_qmm_multi(
                    x,
                    [m["weight"] for m in self.members],
                    [m["scales"] for m in self.members],
                    [m["biases"] for m in self.members],
                    member.bits,
                )
            self._x, self._left = x, len(self.members)
        index = next(i for i, m in enumerate(self.members) if m is member)
        out = self._outs[index]
        self._left -= 1
        if self._left == 0:  # every sibling took its part: hold no graph past this step
            self._x, self._outs = None, []
        return out


def _share_inputs(model: Any) -> int:
    """Link sibling kernel layers of one kind (the same bits, or all float) and width into
    SharedInput groups."""
    groups = 0
    for _, parent in model.named_modules():
        for names in SharedInput.SIBLINGS:
            layers = [parent.get(n) if isinstance(parent, dict) else None for n in names]
            if not all(type(m) in KERNEL_LINEARS for m in layers):
                continue
            if len({(type(m), m.bits, m.input_dims) for m in layers}) != 1:
                continue
            group = SharedInput(layers)
            for m in layers:
                m._shared = group
            groups += 1
    return groups


class RowExactEmbedding(RowExactLinear):
    """An embedding in the kernel's layout: lookups dequantize the picked rows; `as_linear` (a
    tied output layer) is the row-exact matmul."""

    def __call__(self, ids: mx.array) -> mx.array:
        qmm, _ = kernel_status()
        return qmm.dequantize_rows(self["weight"], self["scales"], self["biases"], self.bits, ids)

    def as_linear(self, x: mx.array) -> mx.array:
        return self._matmul(x)

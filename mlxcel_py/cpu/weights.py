"""`--cpu-weights auto|q8|q4|f32`: how a model's linear layers hold their weights on the CPU.

Why: plain decoding on the CPU streams every weight once per token. As float32 the default model
is 540 MB a token, the bandwidth wall; MLX's own CPU quantized matmul is slower still. The
`_qmm` extension (csrc/, built at install) multiplies int8-quantized activations by 4- or 8-bit
weights with AVX-512 VNNI, or AVX-VNNI or AVX2 where a CPU has no AVX-512 (the same bits: csrc/simd.h),
reading 3-5x fewer bytes. Weights come from MLX's affine layout
(q = round((w - bias) / scale) per group) and are repacked once at load into the kernel's own
interleaved layout, with one float32 scale and bias per 32 values.

Exactness: the kernel reduces every output element in an order fixed by K alone, so row i of a
verify block equals the one-row decode step of row i bit for bit (csrc/qmm_kernel.cpp). Int8
activations would turn any last-bit difference upstream into a different rounding, so everything
between two kernels must be row-exact too: attention over those blocks goes to the extension's
one-row-at-a-time attention (`attention`, routed by cpu_kernels.enable_row_exact), and `auto`
uses the kernel only on models where nothing else mixes rows (`why_rows_not_exact`). The other
row-wise ops of a forward run in the extension on this path too (`swiglu`, `RowExactRoPE`): one
vectorised op each instead of MLX's CPU graphs of several ops with an element-at-a-time exp. Speculative
output then equals plain output token for token, with no near-tie caveat. Prefill runs in chunks
of MAX_ROWS - 1 on this path (`cpu_kernels.prefill_chunk`), so a prompt fed in other pieces (a
prompt cache's stored prefix, a chat turn) continues exactly as a fresh one. Blocks wider than
KERNEL_ROWS (a caller's own wide chunk) dequantize to float32 and use BLAS.

Float weights (RowExactFloatLinear, csrc/fmm_kernel.cpp): a float16, bfloat16 or float32 layer
kept in its stored precision, its values widened exactly to float32 inside the kernel and
multiplied with float32 activations, each output summed over K in order: row-exact the same way,
with the model's own weights (a float model's output is then that of `f32`'s up to summation
order), reading 2 bytes a weight for float16 and bfloat16 where `f32` reads 4.

Modes (only where MLX runs on the CPU; elsewhere weights stay as stored):
  f32   every weight dequantized to float32 and multiplied by BLAS (the path before the kernel;
        the fallback)
  q8    every eligible linear layer 8-bit, group 32 (float and 4-bit layers re-quantized)
  q4    every eligible linear layer 4-bit, group 32 (float and 8-bit layers re-quantized)
  auto  the kernels where they built and this CPU has the instructions (AVX-512 VNNI or AVX2),
        each layer in its stored precision: quantized layers keep their own 4 or 8 bits
        (re-quantizing a GGUF's 4-bit blocks to 8 bits costs twice the bytes and adds rounding),
        float layers stay float16, bfloat16 or float32 on the float kernel; quantized layers of
        other bits become 8-bit (a GGUF's other quantized types arrive 8-bit from the conversion:
        models/gguf/convert.py). Otherwise f32.
Eligible: nn.Linear / QuantizedLinear (affine, 2-8 bits) and tied embeddings used as the output
layer; quantized kernel layers need an input width that is a multiple of 64 (others go to the
float kernel dequantized under auto, and stay float32 under q8/q4). Anything else (mixture-of-experts
switch layers, norms) is float32, as before; `describe()` counts both.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import UsageError
from ..inputs.digits import whole_number
from ..options import MAX_DRAFT_LIMIT

MAX_ROWS = MAX_DRAFT_LIMIT + 1  # the widest verify block; decode steps are 1 row
# Blocks up to this many rows use the kernel (a batched step of many sequences' verify blocks
# reaches a few hundred); wider ones dequantize and use BLAS. Measured on this 2-core CPU: the
# kernel took 6.2 ms for 64 rows of a 49152 x 576 4-bit weight, about linear in the rows, where
# BLAS on float32 needs about 4x that at 256 rows before the dequantization.
KERNEL_ROWS = 256
# Blocks of at least this many rows go through AMX tiles where the CPU has them (Sapphire Rapids
# and later; MLXCEL_NO_AMX=1 turns them off): bit-identical to the VNNI rows, so rows stay exact
# whichever path a block takes. Measured here (scripts/amx_rows.py, docs/bench/amx-rows.md):
# 1.1-1.5x over a forward's layers at 16-128 rows, 0.4-0.6x below 16 (the tile round trip and
# the float work per block cost more than the 8 vpdpbusd a row they save).
AMX_ROWS = 16
GROUP = 32  # the group size of layers this module quantizes (GGUF's block size)
KERNEL_GROUPS = (32, 64, 128)


FLOAT_FORMS = {mx.float16: "f16", mx.bfloat16: "bf16", mx.float32: "f32"}  # the float kernel's

KERNEL_ISAS = ("avx512", "avxvnni", "avx2", "f32")  # MLXCEL_KERNEL_ISA: the kernel's build, or none
_ISA_NAMES = {"avx512": "AVX-512 VNNI", "avxvnni": "AVX-VNNI", "avx2": "AVX2"}


@functools.cache
def kernel_status() -> tuple[Any, str]:
    """(the _qmm module or None, a one-line description of why it is or is not in use).

    MLXCEL_KERNEL_ISA picks the kernel's build: `avx512`, `avxvnni`, `avx2` (all give the same
    bits, so an AVX-512 machine tests the AVX2 path) or `f32` (no kernel); unset, the best this
    CPU runs (in that order)."""
    if mx.default_device() != mx.cpu:
        return None, "not needed (MLX runs on the GPU)"
    if os.environ.get("MLXCEL_NO_KERNEL"):
        return None, "turned off by MLXCEL_NO_KERNEL"
    asked = os.environ.get("MLXCEL_KERNEL_ISA", "").strip().lower()
    if asked and asked not in KERNEL_ISAS:
        raise UsageError(
            f"MLXCEL_KERNEL_ISA={asked!r} is not one of {', '.join(KERNEL_ISAS)}",
            hint="unset it to use the best kernel this CPU runs",
        )
    if asked == "f32":
        return None, "turned off by MLXCEL_KERNEL_ISA=f32"
    try:
        from . import _qmm  # type: ignore[attr-defined]
    except ImportError as exc:
        note = Path(__file__).with_name("KERNEL_NOT_BUILT")  # setup.py's reason, when the build failed
        why = note.read_text().strip() if note.is_file() else (str(exc).splitlines()[0] if str(exc) else "ImportError")
        return None, f"not built ({why}; reinstall with a C++ compiler and CMake)"
    if asked and not _qmm.set_isa(asked):
        return None, f"MLXCEL_KERNEL_ISA={asked}: this CPU lacks {_ISA_NAMES[asked]}"
    if not asked and not any(_qmm.set_isa(isa) for isa in KERNEL_ISAS[:-1]):
        return None, "this CPU lacks AVX2 (and AVX-512 VNNI)"
    name = f"row-exact {_ISA_NAMES[_qmm.isa()]} kernel"
    if _qmm.isa() == "avxvnni" and _qmm.avxvnni_as_evex():
        name += " (test build: EVEX vpdpbusd)"
    _qmm.set_threads(default_threads())
    if _qmm.set_amx_rows(0 if os.environ.get("MLXCEL_NO_AMX") else AMX_ROWS):
        return _qmm, f"{name}, AMX tiles from {AMX_ROWS} rows"
    return _qmm, name


def default_threads() -> int:
    env = os.environ.get("MLXCEL_KERNEL_THREADS", "").strip()
    if whole_number(env) and int(env) > 0:
        return int(env)
    from .cores import usable_cores

    return usable_cores()  # the affinity mask, within a container's CPU quota


def _row_count(x: mx.array) -> int:
    return x.size // x.shape[-1] if x.ndim else 1


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool) -> mx.array:
    """The extension's attention, one query row at a time (cpu_kernels.enable_row_exact)."""
    qmm, _ = kernel_status()
    return qmm.row_exact_attention(q, k, v, scale, causal)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x in one vectorised op (cpu_kernels.enable_row_exact): MLX's own is several
    ops with an element-at-a-time exp on this wheel, 0.6 ms a layer at 64 rows against 0.04."""
    qmm, _ = kernel_status()
    return qmm.row_swiglu(gate, x)


class RowExactRoPE(nn.Module):
    """mlx's nn.RoPE through the extension (`patch_rope`): the cos/sin of a forward's positions are
    computed once for all its layers, and each batch entry may sit at its own offset (a batched
    forward's rows). MLX's CPU rope builds a graph of about ten ops per call (0.13 ms, 60 calls a
    forward on the default model). Every forward of the model goes through it, so a row's
    rotation depends only on its position, whatever block it is in."""

    def __init__(self, rope: nn.RoPE):
        super().__init__()
        self.dims, self.traditional, self.base, self.scale = rope.dims, rope.traditional, rope.base, rope.scale
        self._stock = rope
        self.freeze()

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        if x.ndim != 4 or x.dtype != mx.float32:
            return self._stock(x, offset=offset)
        qmm, _ = kernel_status()
        if isinstance(offset, mx.array):
            return qmm.row_rope(x, self.dims, self.traditional, float(self.base), float(self.scale), 0, offset)
        return qmm.row_rope(x, self.dims, self.traditional, float(self.base), float(self.scale), int(offset))


def patch_rope(model: Any) -> int:
    """Give every plain nn.RoPE of `model` the extension's rope; returns how many were replaced.
    (Scaled variants, Llama3RoPE, YaRN... keep their own.)"""
    count = 0
    for _, parent in model.named_modules():
        rope = parent.get("rope") if isinstance(parent, dict) else getattr(parent, "rope", None)
        if type(rope) is nn.RoPE and rope.base is not None:
            parent.rope = RowExactRoPE(rope)
            count += 1
    return count


def cache_attention(
    q: mx.array,
    k_new: mx.array,
    v_new: mx.array,
    k_bufs: list,
    v_bufs: list,
    seq: list[int],
    pos: list[int],
    scale: float,
    tree: Any = None,
) -> list[mx.array]:
    """One layer of a batched forward (batch.RowCaches): entry e's new keys and values written into
    sequence seq[e]'s buffers from position pos[e] on, and each query row attended over its own
    sequence up to its position, by the same one-row code as `attention`. Returns [attention,
    key buffers..., value buffers...]. `tree`: draft-tree rows (engine.tree.Layout's slot, base
    and tail for every entry): each written at its slot, attending its prefix and tail."""
    qmm, _ = kernel_status()
    if tree is None:
        return qmm.row_exact_cache_attention(q, k_new, v_new, k_bufs, v_bufs, seq, pos, scale)
    return qmm.row_exact_cache_attention(
        q, k_new, v_new, k_bufs, v_bufs, seq, pos, scale, slot=tree.slot, base=tree.base, tail=tree.tail
    )


def move_rows(bufs: list, rows: list[int], first: int) -> list[mx.array]:
    """KV buffers [1, heads, capacity, dim] with row rows[j] moved to row first + j (rows
    increasing, at or after first + j), in place where nothing else holds a buffer."""
    qmm, _ = kernel_status()
    return qmm.move_rows(bufs, rows, first)


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


FORM_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


@dataclass(frozen=True)
class WeightsReport:
    # the mode in effect: q8 | q4 | f32 | f16 | bf16 (auto: every kernel layer of that form) |
    # mixed (auto, several forms: a file with 4- and 8-bit layers, or float and quantized ones) | as stored
    mode: str
    asked: str  # what --cpu-weights said
    kernel_layers: int
    float_layers: int  # float32 layers left to BLAS
    bits: tuple[int, ...]  # the bit widths the quantized kernel layers use
    note: str  # kernel status or why it is not in use
    weight_bytes: int
    inexact: str | None = None  # kernel layers in use but a block's rows may differ from decode steps: why
    forms: tuple[str, ...] = ()  # the float forms the float kernel layers keep (f16, bf16, f32)

    def describe(self) -> str:
        if self.kernel_layers == 0:
            return f"{self.mode} ({self.note})" if self.mode == "f32" else self.mode
        kinds = "/".join([f"{b}-bit" for b in self.bits] + [FORM_NAMES[f] for f in self.forms])
        rest = f", {self.float_layers} float32 on BLAS" if self.float_layers else ""
        return (
            f"{self.mode} ({self.kernel_layers} layers {kinds} on the {self.note}{rest}; "
            f"{self.weight_bytes / 2**20:.0f} MiB)"
        )

    def as_json(self) -> dict:
        return {
            "mode": self.mode,
            "asked": self.asked,
            "kernel_layers": self.kernel_layers,
            "float_layers": self.float_layers,
            "bits": list(self.bits),
            "float_forms": list(self.forms),
            "kernel": self.note,
            "weight_mib": round(self.weight_bytes / 2**20, 1),
            "rows_exact": self.kernel_layers > 0 and not self.inexact,
        }


def half_scales(model: Any) -> int:
    """Kernel layers whose scales and biases are all exactly float16 values (a GGUF's own d and m,
    a float16 MLX checkpoint's) keep them as float16: the kernel reads 2 bytes instead of 4 of each
    (a 4-bit layer's bytes drop by a sixth) and converts them back to the same float32 values, so
    no output changes by a bit. Others stay float32. Returns how many layers changed;
    MLXCEL_F32_SCALES=1 keeps every layer float32 (A/B runs)."""
    if os.environ.get("MLXCEL_F32_SCALES"):
        return 0
    changed = 0
    for _, m in model.named_modules():
        if not isinstance(m, RowExactLinear) or m.scales.dtype != mx.float32:
            continue
        s16, b16 = m.scales.astype(mx.float16), m.biases.astype(mx.float16)
        if (
            mx.array_equal(s16.astype(mx.float32), m.scales).item()
            and mx.array_equal(b16.astype(mx.float32), m.biases).item()
        ):
            m.scales, m.biases = s16, b16
            changed += 1
    return changed


def symmetric_biases(model: Any) -> int:
    """Kernel layers whose biases are all exactly their scales times -2^(bits-1) (a GGUF's Q4_0 and
    Q8_0: w = d * (q - 8) or d * (q - 128)) drop them: the kernel computes each one as that exact
    product instead of reading it (a 4-bit layer's bytes drop by a tenth with float16 scales), so
    no output changes by a bit. Returns how many layers changed; MLXCEL_STORED_BIASES=1 keeps
    every layer's biases (A/B runs)."""
    if os.environ.get("MLXCEL_STORED_BIASES"):
        return 0
    changed = 0
    for _, m in model.named_modules():
        if not isinstance(m, RowExactLinear) or m.biases.size == 0:
            continue
        sym = -128.0 if m.bits == 8 else -8.0  # csrc/qmm_kernel.h: symmetric_bias
        if mx.array_equal(m.biases.astype(mx.float32), m.scales.astype(mx.float32) * sym).item():
            m.biases = mx.zeros((0,), dtype=m.scales.dtype)
            changed += 1
    return changed


def _in_features(module: Any) -> int:
    if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return module.weight.shape[-1] * 32 // module.bits
    return module.weight.shape[-1]


FLOAT = "float"  # _target: the float kernel, in the layer's stored precision


def _target(module: Any, asked: str) -> int | str | None:
    """The kernel bits for this layer under `asked` (4 or 8), FLOAT for the float kernel, or
    None to keep it float32 (BLAS)."""
    quantized = isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    if quantized and getattr(module, "mode", "affine") != "affine":
        return None
    if module.weight.ndim != 2:
        return None
    fits = _in_features(module) % 64 == 0  # the quantized kernel's blocks
    if asked in ("q8", "q4"):
        return (8 if asked == "q8" else 4) if fits else None
    if quantized and fits:
        return module.bits if module.bits in (4, 8) else 8
    return FLOAT  # float layers keep their precision; a quantized one of odd width, dequantized exactly


def _affine(module: Any, bits: int) -> tuple[mx.array, mx.array, mx.array, int]:
    """The layer's weight in MLX's affine layout at `bits` with a group the kernel reads: a stored
    layer of those bits as it is, anything else (float, other bits or groups) quantized anew."""
    quantized = isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    if quantized and module.bits == bits and module.group_size in KERNEL_GROUPS:
        return module.weight, module.scales, module.biases, module.group_size
    w = module.weight
    if quantized:
        w = mx.dequantize(w, module.scales, module.biases, group_size=module.group_size, bits=module.bits)
    wq, scales, biases = mx.quantize(w.astype(mx.float32), GROUP, bits)
    return wq, scales, biases, GROUP


def _convert_float(module: Any, *, embedding: bool) -> RowExactFloatLinear:
    """A float layer (or a quantized one dequantized: exact values) on the float kernel."""
    qmm, _ = kernel_status()
    w = module.weight
    if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):  # in float32: exact values
        s, b = module.scales.astype(mx.float32), module.biases.astype(mx.float32)
        w = mx.dequantize(w, s, b, group_size=module.group_size, bits=module.bits)
    if w.dtype not in FLOAT_FORMS:
        w = w.astype(mx.float32)
    packed = qmm.float_repack(w)
    if embedding:
        return RowExactFloatEmbedding(packed, w.shape[0])
    bias = module["bias"].astype(mx.float32) if "bias" in module else None
    return RowExactFloatLinear(packed, w.shape[0], bias)


def _convert(module: Any, bits: int, *, embedding: bool) -> RowExactLinear:
    qmm, _ = kernel_status()
    wq, scales, biases, group = _affine(module, bits)
    # the kernel takes one float32 scale and bias per 32 values: a group of 64 or 128 repeats its own
    # (materialized: the kernel reads contiguous rows, and would copy a strided view every call)
    per_block = lambda a: mx.contiguous(
        mx.repeat(a.astype(mx.float32), group // 32, axis=1) if group > 32 else a.astype(mx.float32)
    )
    scales, biases = qmm.interleave(per_block(scales)), qmm.interleave(per_block(biases))
    packed = qmm.repack(wq, bits)
    if embedding:
        return RowExactEmbedding(packed, scales, biases, bits)
    bias = module["bias"].astype(mx.float32) if "bias" in module else None
    return RowExactLinear(packed, scales, biases, bits, bias)


def _tied_embeddings(model: Any) -> set[int]:
    """Embeddings the model also uses as its output layer (`as_linear`): no `lm_head` module.
    Only these float embeddings are quantized; a stored quantized embedding is kept as it is."""
    names = [name for name, _ in model.named_modules()]
    if any(n == "lm_head" or n.endswith(".lm_head") for n in names):
        return set()
    return {id(m) for _, m in model.named_modules() if isinstance(m, nn.Embedding)}


def weight_bytes(model: Any) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def why_rows_not_exact(model: Any) -> str | None:
    """Why a verify block's rows could differ from decode steps on the kernel path, or None.

    The kernel's int8 activations turn a last-bit difference upstream into a different rounding,
    so every op between two kernels must treat each row alone: plain KV caches (no windows, no
    recurrent state computed over a block), attention routed to the one-row kernel, and every
    matmul on the kernel (a float32 layer would multiply a block with BLAS)."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    from . import kernels as cpu_kernels

    if not cpu_kernels.routes_attention(model):
        return f"{type(model).__module__.rsplit('.', 1)[-1]} does not call mlx-lm's attention by name"
    try:
        caches = make_prompt_cache(model)
    except Exception as exc:  # a model that cannot make its caches fails later in its own words
        return f"its caches could not be made ({type(exc).__name__})"
    other = sorted({type(c).__name__ for c in caches if type(c) is not KVCache})
    if other:
        return f"its caches include {', '.join(other)} (windows or recurrent state)"
    tied = _tied_embeddings(model)
    for name, m in model.named_modules():
        if "Switch" in type(m).__name__:
            return f"{name} is a mixture-of-experts layer"
        is_linear = type(m) in (nn.Linear, nn.QuantizedLinear)
        if (is_linear or id(m) in tied) and _target(m, "auto") is None:
            return f"{name} ({_in_features(m)} inputs) does not fit the kernel"
    return None


ARENA_BYTES = 64 << 20  # weights moved per arena: what a load holds twice at a time


def huge_pages(model: Any) -> tuple[int, int]:
    """Move the kernel layers' arrays, in the order a forward reads them, into arenas of
    transparent huge pages (csrc/huge_pages.cpp: the step streams them every token, and with
    4 KiB pages every 4 KiB is a TLB miss). The values are copies: outputs do not change. Each
    arena takes about ARENA_BYTES, so a load holds at most that much twice.
    MLXCEL_NO_HUGE_PAGES=1 keeps MLX's own buffers (for A/B runs). Returns (arena bytes, bytes
    the kernel backs with huge pages); (0, 0) when nothing moved."""
    qmm, _ = kernel_status()
    if qmm is None or not hasattr(qmm, "to_huge_pages") or os.environ.get("MLXCEL_NO_HUGE_PAGES"):
        return 0, 0
    slots: list[tuple[Any, str]] = []
    for _, module in model.named_modules():
        if isinstance(module, KERNEL_LINEARS):
            slots += [(module, key) for key in ("weight", "scales", "biases", "bias") if key in module]
    # named_modules lists children after their parents, newest first: reversed, it is the order
    # of definition (the embedding, then layer 0's attention and MLP, ...), the order a step reads
    slots.reverse()
    chunks: list[list[tuple[Any, str]]] = [[]]
    held = 0
    for module, key in slots:
        if held >= ARENA_BYTES:
            chunks.append([])
            held = 0
        chunks[-1].append((module, key))
        held += module[key].nbytes
    size = huge = 0
    for chunk in chunks:  # (an empty one, when there are no slots, moves nothing)
        arrays, n, h = qmm.to_huge_pages([m[k] for m, k in chunk])
        for (module, key), a in zip(chunk, arrays):
            module[key] = a  # the original is freed here (nothing else holds it)
        size, huge = size + n, huge + h
    return size, huge


def peak_memory() -> int:
    """MLX's peak memory plus the huge-page arenas (mapped outside MLX's allocator, so its
    counters miss the weights that moved there)."""
    qmm, _ = kernel_status()
    arenas = qmm.huge_pages_bytes() if qmm is not None and hasattr(qmm, "huge_pages_bytes") else 0
    return mx.get_peak_memory() + arenas


def apply(model: Any, asked: str) -> WeightsReport:
    """Put `model`'s weights in the form `asked` picks (CPU only); float32 for everything else."""
    from mlx.utils import tree_unflatten

    # the kernel's layers are not nn.QuantizedLinear/QuantizedEmbedding, so this leaves them alone
    from mlx_lm.utils import dequantize_model

    qmm, note = kernel_status()
    inexact = why_rows_not_exact(model) if qmm is not None and asked != "f32" else None
    mode = asked
    if asked == "auto":
        mode = "kernel" if qmm is not None and inexact is None else "f32"
        if qmm is not None and inexact is not None:
            note = f"row-exact kernel not used: {inexact}"
    if mode == "f32" or qmm is None:
        dequantize_model(model)
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        return WeightsReport("f32", asked, 0, 0, (), note if asked == "auto" else "asked for", weight_bytes(model))

    tied = _tied_embeddings(model)
    replaced: list[tuple[str, Any]] = []
    used: set[int | str] = set()  # bits, and the float forms
    for name, module in model.named_modules():
        is_embedding = isinstance(module, (nn.Embedding, nn.QuantizedEmbedding))
        if is_embedding and not (isinstance(module, nn.QuantizedEmbedding) or id(module) in tied):
            continue  # a float embedding only looked up: quantizing it would only add rounding
        if type(module) not in (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding):
            continue  # a subclass with its own forward (LoRA, switch layers): leave it alone
        target = _target(module, asked)
        if target is None:
            continue
        layer = (
            _convert_float(module, embedding=is_embedding)
            if target == FLOAT
            else _convert(module, target, embedding=is_embedding)
        )
        replaced.append((name, layer))
        used.add(layer.form if target == FLOAT else target)
    converted = {n for n, _ in replaced}
    float_layers = sum(
        1
        for name, m in model.named_modules()
        if (type(m) in (nn.Linear, nn.QuantizedLinear) or "SwitchLinear" in type(m).__name__) and name not in converted
    )
    # everything else to float32 first: set_dtype would widen the float kernel's float16 weights
    dequantize_model(model)
    model.set_dtype(mx.float32)  # norms, float layers, biases (and the layers replaced just below)
    if replaced:
        model.update_modules(tree_unflatten(replaced))
        _share_inputs(model)
    half_scales(model)
    symmetric_biases(model)
    mx.eval(model.parameters())
    huge_pages(model)
    bits = {u for u in used if isinstance(u, int)}
    forms = {u for u in used if isinstance(u, str)}
    label = asked
    if asked == "auto":
        label = "mixed" if len(used) > 1 else next(iter(used)) if used else "f32"
        label = {4: "q4", 8: "q8"}.get(label, label)
    return WeightsReport(
        label,
        asked,
        len(replaced),
        float_layers,
        tuple(sorted(bits)),
        note,
        weight_bytes(model),
        inexact,
        tuple(sorted(forms)),
    )

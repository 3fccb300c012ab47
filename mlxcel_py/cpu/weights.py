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

import os
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .extension import kernel_status
from .layers import (
    FLOAT_FORMS,
    GROUP,
    KERNEL_GROUPS,
    KERNEL_LINEARS,
    RowExactEmbedding,
    RowExactFloatEmbedding,
    RowExactFloatLinear,
    RowExactLinear,
    _share_inputs,
)

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

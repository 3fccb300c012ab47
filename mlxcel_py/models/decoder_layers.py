"""The llama family's decoder layers as one op each, on the row-exact CPU kernel path.

Why: a decode step through mlx-lm's model code is about 40 MLX ops a layer (1,200 on the default
model): norms, three projections, reshapes and transposes, rope, the cache's slice update, the
attention, the MLP. On this CPU their Python graph building and per-op dispatch took as long as
the matmuls. `_qmm.DecoderLayer` (csrc/layer_kernel.cpp) does a whole layer in one op (RMSNorm,
q/k/v, rope, the cache write, attention, o, residual, RMSNorm, gate/up, SwiGLU, down, residual),
so a step is the embedding, one op a layer, the final norm and the output layer.

Which models: llama, mistral, qwen2 (q/k/v biases) and qwen3 (per-head q/k norms), when every
layer's linears are on a kernel (RowExactLinear quantized, or RowExactFloatLinear in the layer's
stored float precision: a layer may mix both), its norms are plain RMSNorms, its rope is
the extension's (RowExactRoPE) and no layer slides a window. Anything else keeps mlx-lm's code.

When: inside `cpu.kernels.engaged` with the row-exact attention on, a forward of token ids over
plain KV caches (one sequence: a decode step, a verify block, a prompt chunk) or over a batched
step's `RowCaches` in the ragged layout (several sequences, one row per entry). Both go through
the same op and the same per-row code, so a row's logits are the same bits whether it is a
decode step, a row of a verify block or a row of a batch: the row-exact contract holds. Other
calls (input embeddings, other caches, blocks wider than KERNEL_ROWS) take mlx-lm's forward.

How: the text model's class is swapped, on this one object, for a subclass whose __call__ tries
the fused forward first (stock mlx-lm models in the same process are untouched). The KV buffers
stay mlx-lm's KVCache objects (keys, values, offset), grown as mlx-lm grows them, so trims,
rollbacks, prompt caches and later mlx-lm calls see what they expect.

Cache type (--cache-type-k / --cache-type-v): the buffers a fused layer allocates hold float16
keys and values by default (`auto`), or float32. A row is rounded once, when the op writes it, and
the attention widens what it reads, so every later read of a row sees the same bits: verify rows
still equal decode steps, at the chosen type. A step at a long context reads the cache more than
the weights (6k tokens: ~280 MB of float32 against 92 MB), so half the bytes is most of a step.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from ..cpu import extension as cpu_extension
from ..cpu import kernels as cpu_kernels
from ..cpu import layers as cpu_layers
from ..cpu import row_ops as cpu_row_ops
from ..errors import ModelError
from . import cache_kinds
from .families import model_type
from .taps import layer_recorder, text_model

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
LINEARS = (
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
)

_FUSED: dict[int, list] = {}  # id(text model) -> its layers' ops
_GEOMETRY: dict[int, list] = {}  # id(text model) -> its layers' ops, kept while `unfused` (cache types)
_CLASSES: dict[type, type] = {}


def why_not(model: Any) -> str | None:
    """Why `model`'s layers cannot be fused, or None."""
    qmm, _ = cpu_extension.kernel_status()
    if qmm is None or not hasattr(qmm, "DecoderLayer"):
        return "the row-exact kernel is not in use"
    if not cpu_kernels.row_exact(model):
        return "its attention is not the row-exact one"
    _, inner = text_model(model)
    if getattr(inner, "pipeline_size", 1) > 1:  # a pipeline stage: its forward passes hidden states between ranks
        return "a pipeline stage (--pp-size) runs mlx-lm's layers between the ranks' messages"
    kind = model_type(model)
    if kind not in FAMILIES:
        return f"{kind} is not one of {', '.join(FAMILIES)}"
    for i, layer in enumerate(getattr(inner, "layers", None) or []):
        if getattr(layer, "use_sliding", False):
            return f"layer {i} attends a sliding window"
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        for part, name in LINEARS:
            lin = getattr({"self_attn": attn, "mlp": mlp}[part], name, None)
            if getattr(lin, "exchanges_rows", False):  # parallel.exact_tp.GatheredRows: ranks talk mid-layer
                return "a tensor-parallel rank (--tp-size) gathers its rows from the other ranks inside each layer"
            if type(lin) not in cpu_layers.KERNEL_LINEARS:
                return f"layer {i} {part}.{name} is not on the kernel"
            if type(lin) is cpu_layers.RowExactFloatLinear and lin.n % 16:
                return f"layer {i} {part}.{name} has {lin.n} outputs, not whole groups of 16"
        norms = [layer.get("input_layernorm"), layer.get("post_attention_layernorm")]
        if kind == "qwen3":
            norms += [attn.get("q_norm"), attn.get("k_norm")]
        if any(type(n) is not nn.RMSNorm for n in norms):
            return f"layer {i} has a norm other than RMSNorm"
        if type(getattr(attn, "rope", None)) is not cpu_row_ops.RowExactRoPE:
            return f"layer {i} has a rope other than plain RoPE"
    if not getattr(inner, "layers", None):
        return "no decoder layers found"
    # a block of another class may do more than the op does (extra norms, scaled residuals)
    # (a layer a tap records is its own class underneath: taps.layer_tap)
    if {getattr(type(layer), "_mlxcel_recorded", type(layer)).__name__ for layer in inner.layers} != {
        "TransformerBlock"
    }:
        return "its decoder blocks are not the family's own TransformerBlock"
    return None


# options.CACHE_TYPES; a q8_0 buffer is int8, a q4_0 one uint8 (cache_kinds.row_width: their rows
# carry their scales)
KV_DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16, "q8_0": mx.int8, "q4_0": mx.uint8}
AUTO_CACHE_TYPE = "f16"  # what `auto` means where the fused layers run
BLOCK_HEAD_DIMS = (32, 64, 128)  # the widths the attention reads q8_0 and q4_0 rows at (csrc kv_block_head_dim)


@dataclass(frozen=True)
class _Layer:
    op: Any  # _qmm.DecoderLayer
    kv_heads: int
    head_dim: int
    kv_dtypes: tuple[mx.Dtype, mx.Dtype] = (mx.float32, mx.float32)  # new buffers: keys, values


def _layer_op(qmm: Any, layer: Any, qwen3: bool, kv_dtypes: tuple[mx.Dtype, mx.Dtype]) -> _Layer:
    attn = layer.self_attn
    mods = [getattr(getattr(layer, part), name) for part, name in LINEARS]
    rope = attn.rope
    n_heads = attn.n_heads
    n_kv = attn.n_kv_heads
    head_dim = mods[0].n // n_heads
    op = qmm.DecoderLayer(
        [m["weight"] for m in mods],
        [m["scales"] if "scales" in m else None for m in mods],  # float linears have none
        [m["biases"] if "biases" in m else None for m in mods],
        [m.bits for m in mods],
        [m["bias"] if "bias" in m else None for m in mods],
        layer.input_layernorm.weight.astype(mx.float32),
        layer.post_attention_layernorm.weight.astype(mx.float32),
        attn.q_norm.weight.astype(mx.float32) if qwen3 else None,
        attn.k_norm.weight.astype(mx.float32) if qwen3 else None,
        float(layer.input_layernorm.eps),
        float(attn.q_norm.eps) if qwen3 else 0.0,
        n_heads,
        n_kv,
        head_dim,
        int(rope.dims),
        bool(rope.traditional),
        float(rope.base),
        float(rope.scale),
        float(attn.scale),
    )
    return _Layer(op, n_kv, head_dim, kv_dtypes)


def cache_dtypes(cache_types: tuple[str, str], head_dim: int | None = None) -> tuple[mx.Dtype, mx.Dtype]:
    """The buffers' dtypes for (--cache-type-k, --cache-type-v), `auto` resolved; q8_0 or q4_0 at a
    head width its attention does not read stays float16 (kv_cache.describe says so)."""
    k, v = (AUTO_CACHE_TYPE if t == "auto" else t for t in cache_types)
    fits = head_dim is None or head_dim in BLOCK_HEAD_DIMS
    return tuple(KV_DTYPES[t] if KV_DTYPES[t] not in cache_kinds.BLOCK_DTYPES or fits else mx.float16 for t in (k, v))


def install(model: Any, cache_types: tuple[str, str] = ("auto", "auto")) -> int:
    """Fuse `model`'s decoder layers where `why_not` allows; returns how many (0: none). Caches
    they start hold `cache_types` (keys, values). MLXCEL_NO_FUSED_LAYERS=1 keeps mlx-lm's layer
    code (for A/B runs)."""
    if os.environ.get("MLXCEL_NO_FUSED_LAYERS") or why_not(model) is not None:
        return 0
    qmm, _ = cpu_extension.kernel_status()
    _, inner = text_model(model)
    qwen3 = model_type(model) == "qwen3"
    attn = inner.layers[0].self_attn
    dtypes = cache_dtypes(cache_types, attn.q_proj.n // attn.n_heads)
    ops = [_layer_op(qmm, layer, qwen3, dtypes) for layer in inner.layers]
    key = id(inner)
    if key not in _FUSED:
        weakref.finalize(inner, _FUSED.pop, key, None)
        weakref.finalize(inner, _GEOMETRY.pop, key, None)
    _FUSED[key] = _GEOMETRY[key] = ops
    base = type(inner)
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Fused{base.__name__}", (base,), {"__call__": _call, "_mlxcel_base": base})
    if type(inner) is base:
        inner.__class__ = _CLASSES[base]
    return len(ops)


@contextmanager
def unfused(model: Any) -> Iterator[None]:
    """Forwards inside take mlx-lm's layer code (the reference the fused layers are checked against)."""
    _, inner = text_model(model)
    ops = _FUSED.pop(id(inner), None)
    try:
        yield
    finally:
        if ops is not None:
            _FUSED[id(inner)] = ops


def fused_layers(model: Any) -> list:
    """`model`'s fused layer ops (kv heads, head dim, cache dtypes), or [] (also for models
    without a text model of the usual shape: Mamba, RWKV...)."""
    lm = getattr(model, "language_model", model)
    inner = getattr(lm, "model", None)
    return _FUSED.get(id(inner), []) if inner is not None else []


def fused(model: Any) -> bool:
    """Whether `model`'s forwards go through the fused layers (where a call allows it)."""
    _, inner = text_model(model)
    return id(inner) in _FUSED


def _call(self, inputs, cache=None, input_embeddings=None, **kwargs):
    ops = _FUSED.get(id(self))
    plan = _plan(inputs, cache, input_embeddings, kwargs, len(ops)) if ops is not None else None
    if plan is None:
        if (
            ops is not None
            and _too_wide(inputs)
            and _plan(inputs[:, :1], cache, _first(input_embeddings), kwargs, len(ops))
        ):
            return _in_chunks(self, inputs, cache, input_embeddings)  # only too wide for one op
        _reserve_at_cache_type(_GEOMETRY.get(id(self)), inputs, cache, input_embeddings)
        _refuse_blocks(cache)
        return self._mlxcel_base.__call__(self, inputs, cache=cache, input_embeddings=input_embeddings, **kwargs)
    seq, pos, tree = plan
    # draft-tree rows (engine.tree): written at their slots, attending their prefix and tail
    rows = {} if tree is None else dict(slot=tree.slot, base=tree.base, tail=tree.tail)
    # input embeddings: a vision prompt's rows (vision.target), one row per input position
    h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
    recorder = layer_recorder(self)  # drafters that read layer outputs (taps.layer_tap)
    for i, (layer, c) in enumerate(zip(ops, cache)):
        groups, ends = _sequences(c, len(seq))
        for kv, end in zip(groups, ends):
            cache_kinds.reserve(kv, end - kv.offset, layer.kv_heads, layer.head_dim, layer.kv_dtypes)
        out = layer.op(h, [kv.keys for kv in groups], [kv.values for kv in groups], seq, pos, **rows)
        h = out[0]
        if recorder is not None:
            recorder.record(i, h)
        n = len(groups)
        for s, (kv, end) in enumerate(zip(groups, ends)):
            kv.keys, kv.values, kv.offset = out[1 + s], out[1 + n + s], end
    return self.norm(h)


def _too_wide(inputs) -> bool:
    """One sequence's block of more rows than the op takes at once."""
    return inputs.ndim == 2 and inputs.shape[0] == 1 and inputs.shape[1] > cpu_layers.KERNEL_ROWS


def _first(input_embeddings):
    return None if input_embeddings is None else input_embeddings[:, :1]


def _in_chunks(model, inputs, cache, input_embeddings):
    """A one-sequence block wider than the op takes, as consecutive chunks through it: the same
    rows (each row's bits depend on its position and keys alone), and a q8_0/q4_0 cache is never
    written by mlx-lm's code, which cannot round to it."""
    step = cpu_layers.KERNEL_ROWS
    outs = [
        _call(
            model,
            inputs[:, i : i + step],
            cache,
            None if input_embeddings is None else input_embeddings[:, i : i + step],
        )
        for i in range(0, inputs.shape[1], step)
    ]
    return mx.concatenate(outs, axis=1)


def _refuse_blocks(cache) -> None:
    """mlx-lm's layer code would write float rows into a q8_0/q4_0 buffer: refuse in one line."""
    for c in cache or ():
        held = getattr(c, "keys", None)
        if type(c) is KVCache and held is not None and {held.dtype, c.values.dtype} & set(cache_kinds.BLOCK_DTYPES):
            raise ModelError(
                "a q8_0 or q4_0 KV cache is written by the fused decoder layers only, and this forward "
                "takes mlx-lm's layer code; run it with --cache-type-k/-v f16"
            )


def _reserve_at_cache_type(ops: list | None, inputs, cache, input_embeddings) -> None:
    """Before mlx-lm's layer code writes plain caches (a block wider than the op takes, input
    embeddings, `unfused`): room for its rows at the cache type, so its writes round to that type
    (MLX's astype, the op's rounding) and the cache keeps one type whichever code wrote a row."""
    rows = input_embeddings if input_embeddings is not None else inputs
    if ops is None or cache is None or len(cache) != len(ops) or rows.ndim < 2 or rows.shape[0] != 1:
        return
    if not all(type(c) is KVCache for c in cache) or ops[0].kv_dtypes == (mx.float32, mx.float32):
        return
    # q8_0/q4_0 sides stay float32 here: mlx-lm writes floats, and attention_at rounds them as it reads
    dtypes = tuple(mx.float32 if t in cache_kinds.BLOCK_DTYPES else t for t in ops[0].kv_dtypes)
    for layer, kv in zip(ops, cache):
        cache_kinds.reserve(kv, rows.shape[1], layer.kv_heads, layer.head_dim, dtypes)


def _plan(inputs, cache, input_embeddings, kwargs, n_layers: int) -> tuple[list[int], list[int], Any] | None:
    """(sequence, position) of every row of this forward and its draft-tree rows (or None), or
    None when it is not one for the fused layers."""
    if kwargs or cache is None or len(cache) != n_layers:
        return None
    if input_embeddings is not None and input_embeddings.shape[:2] != inputs.shape:
        return None
    if not cpu_kernels.row_exact_now() or inputs.ndim != 2 or inputs.size > cpu_layers.KERNEL_ROWS:
        return None
    first = cache[0]
    if type(first) is KVCache:
        if inputs.shape[0] != 1 or not all(type(c) is KVCache for c in cache):
            return None
        start = first.offset
        return [0] * inputs.shape[1], list(range(start, start + inputs.shape[1])), None
    plan = getattr(first, "plan", None)  # engine.batch.RowCaches in the ragged layout
    if plan is None or inputs.shape[1] != 1 or len(plan.seq) != inputs.shape[0]:
        return None
    if not all(type(kv) is KVCache for c in cache for kv in c.caches):
        return None
    return list(plan.seq), list(plan.pos), plan.tree


def _sequences(c: Any, rows: int) -> tuple[list[KVCache], list[int]]:
    """A layer's caches and where each ends after this forward."""
    if type(c) is KVCache:
        return [c], [c.offset + rows]
    return list(c.caches), list(c.plan.ends)

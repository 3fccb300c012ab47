"""Adapters fused into the loaded model before its weights take their CPU form: mlx-lm adapter
folders (--adapter-path; LoRA, DoRA or a full fine-tune, as mlx_lm.lora writes them) and llama.cpp's
GGUF LoRA files (--lora, --lora-scaled), several at once, each at its own scale.

Why fused: the fused model is an ordinary model, so the row-exact kernels, the fused decoder layers
and every drafter run on it unchanged (an unfused adapter's extra matmuls would leave the kernels
and make verify rows differ from decode steps). A layer's new weight is its (dequantized) weight
plus every adapter's `(scale * lora_b.T) @ lora_a.T`, summed (with one adapter at scale 1, the
arithmetic of mlx-lm's LoRALinear.fuse to the bit), then quantized again, once, at the layer's
group size and its own bits or 8 where it had fewer (`fused_bits`: a second 4-bit rounding
drowns the delta). A scale of 0 leaves an adapter out, so all-zero scales give the base model exactly. Other
scales (llama-server's POST /lora-adapters and per-request `lora`) are other fused models; the
server keeps a few (server/adapter_variants.py).

A GGUF adapter (llama.cpp's convert_lora_to_gguf.py) holds `<tensor>.lora_a` [rank, in] and
`<tensor>.lora_b` [out, rank] for the base's tensor names, and `adapter.lora.alpha`: its scale is
alpha / rank, as llama.cpp applies it. Llama-family Q/K rows are stored in llama.cpp's rotary
order, so lora_b's rows are put back as the base's own Q/K rows are (gguf.convert._unpermute).

DoRA and full fine-tunes change more than a low-rank delta: they go through mlx-lm's own
`load_adapters` and fuse, alone and at scale 1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..options import AdapterSpec


@dataclass
class Adapter:
    """An adapter read from disk: low-rank pairs by module name, or (DoRA, full) a folder only
    mlx-lm's own loader attaches."""

    spec: AdapterSpec
    pairs: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # module -> (lora_a [in, r], lora_b [r, out])
    scale: float = 1.0  # the adapter's own scale (mlx-lm's lora_parameters.scale, GGUF alpha / rank)
    whole: str | None = None  # "dora" / "full": mlx-lm attaches it (alone, at scale 1)
    task_name: str = ""  # GGUF adapter.lora.task_name / prompt_prefix (llama-server lists them)
    prompt_prefix: str = ""


def _fail(spec: AdapterSpec, why: str) -> ModelError:
    return ModelError(f"{spec.flag} {spec.path}: it does not fit this model ({why})")


def read(spec: AdapterSpec, config: dict) -> Adapter:
    """Read the adapter `spec` names for a model of `config` (its Hugging Face config)."""
    return _read_gguf(spec, config) if spec.is_gguf else _read_folder(spec)


def _read_folder(spec: AdapterSpec) -> Adapter:
    import mlx.core as mx

    folder = Path(spec.path)
    try:
        cfg = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{spec.flag} {spec.path}: cannot read adapter_config.json ({exc})") from None
    kind = cfg.get("fine_tune_type", "lora")
    if kind != "lora":
        return Adapter(spec, whole=str(kind))
    try:
        weights = mx.load(str(folder / "adapters.safetensors"))
        scale = float(cfg["lora_parameters"]["scale"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{spec.flag} {spec.path}: cannot read the adapter ({exc})") from None
    pairs: dict[str, dict[str, Any]] = {}
    for name, value in weights.items():
        module, _, leaf = name.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise _fail(spec, f"{name} is not a LoRA tensor")
        if value.ndim != 2:  # a mixture-of-experts layer's stacked pairs: mlx-lm's own loader fuses those
            return Adapter(spec, whole="lora")
        pairs.setdefault(module, {})[leaf] = value
    return Adapter(spec, _complete(spec, pairs), scale)


def _read_gguf(spec: AdapterSpec, config: dict) -> Adapter:
    import mlx.core as mx
    import numpy as np

    from .gguf import arch as gguf_arch
    from .gguf import convert

    reader = convert.read(Path(spec.path))
    md = convert.metadata(reader)
    if md.get("general.type") != "adapter" or md.get("adapter.type") != "lora":
        raise ModelError(
            f"{spec.flag} {spec.path}: not a GGUF LoRA adapter (general.type {md.get('general.type')!r}, "
            f"adapter.type {md.get('adapter.type')!r}); llama.cpp's convert_lora_to_gguf.py writes them"
        )
    arch = gguf_arch.lookup(str(md.get("general.architecture")), spec.path, md)
    pairs: dict[str, dict[str, Any]] = {}
    for t in reader.tensors:
        base, _, leaf = t.name.rpartition(".")
        mlx_name = arch.mlx_name(base) if leaf in ("lora_a", "lora_b") else None
        if mlx_name is None or not mlx_name.endswith(".weight"):
            raise _fail(spec, f"tensor {t.name} names no weight this architecture has")
        value = np.asarray(convert._decode(t), dtype=np.float32)
        module = mlx_name.removesuffix(".weight")
        if leaf == "lora_b":  # [out, rank]: the output rows are in the base tensor's stored order
            value = convert._undo_quirks(arch, mlx_name, value, config)
        # mlx-lm's orientation: lora_a [in, rank], lora_b [rank, out]
        pairs.setdefault(module, {})[leaf] = mx.array(np.ascontiguousarray(value.T))
    alpha = float(md.get("adapter.lora.alpha", 0.0) or 0.0)
    complete = _complete(spec, pairs)
    ranks = {a.shape[1] for a, _ in complete.values()}
    if alpha and len(ranks) != 1:
        raise _fail(spec, f"its layers have ranks {sorted(ranks)}; alpha / rank needs one rank")
    scale = alpha / ranks.pop() if alpha and ranks else 1.0
    return Adapter(
        spec,
        complete,
        scale,
        task_name=str(md.get("adapter.lora.task_name", "") or ""),
        prompt_prefix=str(md.get("adapter.lora.prompt_prefix", "") or ""),
    )


def _complete(spec: AdapterSpec, pairs: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    out = {}
    for module, leaves in pairs.items():
        if set(leaves) != {"lora_a", "lora_b"}:
            raise _fail(spec, f"{module} has {', '.join(sorted(leaves))} only")
        a, b = leaves["lora_a"], leaves["lora_b"]
        if a.shape[1] != b.shape[0]:
            raise _fail(spec, f"{module}: lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)} disagree on the rank")
        out[module] = (a, b)
    if not out:
        raise _fail(spec, "it holds no LoRA tensors")
    return out


def fuse(model: Any, adapters: Sequence[Adapter]) -> int:
    """Fuse `adapters` (each at its spec's scale; 0 leaves it out) into `model`; returns the
    layers changed."""
    import mlx.nn as nn

    live = [a for a in adapters if a.spec.scale != 0]
    whole = [a for a in live if a.whole is not None]
    if whole:
        a = whole[0]
        if len(live) > 1 or a.spec.scale != 1:
            raise ModelError(
                f"{a.spec.flag} {a.spec.path}: a {a.whole} adapter folder fuses alone at scale 1 here",
                hint="give it as the only adapter, without a scale",
            )
        return _fuse_with_mlx_lm(model, a.spec)
    modules = dict(model.named_modules())
    deltas: dict[str, list[tuple[float, Any, Any]]] = {}
    for a in live:
        for name, (lora_a, lora_b) in a.pairs.items():
            layer = modules.get(name)
            if not isinstance(layer, (nn.Linear, nn.QuantizedLinear)):
                raise _fail(a.spec, f"the model has no linear layer {name}")
            out_dims, in_dims = _dims(layer)
            if lora_a.shape[0] != in_dims or lora_b.shape[1] != out_dims:
                raise _fail(
                    a.spec,
                    f"{name} is {out_dims} x {in_dims}; the adapter's pair makes {lora_b.shape[1]} x {lora_a.shape[0]}",
                )
            # mlx-lm's LoRALinear.scale times the user's: exactly its own scale when that is 1
            deltas.setdefault(name, []).append((a.scale * a.spec.scale, lora_a, lora_b))
    fused = [(name, _fused(modules[name], parts)) for name, parts in deltas.items()]
    if fused:
        from mlx.utils import tree_unflatten

        model.update_modules(tree_unflatten(fused))
    return len(fused)


def _dims(layer: Any) -> tuple[int, int]:
    """(out, in) of a linear layer, quantized or not."""
    import mlx.nn as nn

    out_dims, cols = layer.weight.shape
    return out_dims, cols * 32 // layer.bits if isinstance(layer, nn.QuantizedLinear) else cols


def _fused(layer: Any, parts: list[tuple[float, Any, Any]]) -> Any:
    """mlx-lm's LoRALinear.fuse, with the deltas of several adapters summed and a quantized layer
    quantized again at `fused_bits`."""
    import mlx.core as mx
    import mlx.nn as nn

    quantized = isinstance(layer, nn.QuantizedLinear)
    weight = layer.weight
    if quantized:
        weight = mx.dequantize(
            weight, layer.scales, layer.biases, group_size=layer.group_size, bits=layer.bits, mode=layer.mode
        )
    out_dims, in_dims = weight.shape
    new = nn.Linear(in_dims, out_dims, bias="bias" in layer)
    delta = None
    for scale, lora_a, lora_b in parts:
        d = ((scale * lora_b.T) @ lora_a.T).astype(weight.dtype)
        delta = d if delta is None else delta + d
    new.weight = weight + delta
    if "bias" in layer:
        new.bias = layer.bias
    if quantized:  # at 8 bits at least: the delta is finer than a 4-bit step (fused_bits)
        new = nn.QuantizedLinear.from_linear(new, layer.group_size, fused_bits(layer), mode=layer.mode)
    return new


def fused_bits(layer: Any) -> int:
    """The bits a fused quantized layer is stored at: its own, and 8 where it had fewer (affine).
    Quantizing weight + delta again at 4 bits adds a new rounding as large as the first one, on
    every weight, and the adapter's delta is mostly smaller than a 4-bit step: a random LoRA on
    the default model then changed the greedy text from its first token where llama.cpp, which
    adds the delta unfused in float, did not; fused at 8 bits the two agree as far as the base
    models do (scripts/lora_vs_llama_cpp.py, docs/cpu.md). mlx-lm's own generation applies an
    adapter unfused, in float, too."""
    return max(layer.bits, 8) if getattr(layer, "mode", "affine") == "affine" else layer.bits


def _fuse_with_mlx_lm(model: Any, spec: AdapterSpec) -> int:
    """A DoRA or full fine-tune folder: mlx-lm attaches it (checking every tensor) and fuses it."""
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import load_adapters

    try:
        load_adapters(model, spec.path)
    except (ValueError, KeyError, OSError, TypeError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _fail(spec, first) from None
    fused = [(name, _requantized(m)) for name, m in model.named_modules() if hasattr(m, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))
    return len(fused)


def _requantized(wrapped: Any) -> Any:
    """mlx-lm's fuse of one attached layer, in float, then quantized at `fused_bits` where the
    layer under it was quantized (a stacked mixture-of-experts layer keeps mlx-lm's own fuse)."""
    import mlx.nn as nn

    inner = getattr(wrapped, "linear", None)
    if not isinstance(inner, nn.QuantizedLinear):
        return wrapped.fuse(dequantize=False)
    out = wrapped.fuse(dequantize=True)
    return nn.QuantizedLinear.from_linear(out, inner.group_size, fused_bits(inner), mode=inner.mode)


def load_all(model: Any, specs: Sequence[AdapterSpec], config: dict) -> list[Adapter]:
    """Read every adapter and fuse those with a scale into `model`."""
    adapters = [read(s, config) for s in specs]
    fuse(model, adapters)
    return adapters

"""--adapter-path / --lora: an mlx-lm adapter (LoRA, DoRA or a full fine-tune, as mlx_lm.lora
writes it) put into the loaded model before its weights take their CPU form.

The adapter's layers are attached with mlx-lm's own `load_adapters` (which checks every tensor
against the model) and then fused into the weights as `mlx_lm.fuse` fuses them by default: a
quantized layer is dequantized, gets the adapter's delta and is quantized again at its own bits
and group size. The fused model is an ordinary model, so the row-exact kernels, the fused decoder
layers and every drafter run on it unchanged (an unfused adapter's extra matmuls would leave the
kernels and make verify rows differ from decode steps), and its output is the output of the model
`mlx_lm.fuse` would write.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError


def fuse_adapter(model: Any, adapter_path: str) -> int:
    """Attach and fuse the adapter in `adapter_path` into `model`; returns the layers it changed."""
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import load_adapters

    try:
        load_adapters(model, adapter_path)
    except (ValueError, KeyError, OSError, TypeError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"--adapter-path {adapter_path}: it does not fit this model ({first})") from None
    fused = [(name, m.fuse(dequantize=False)) for name, m in model.named_modules() if hasattr(m, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))
    return len(fused)

"""Reading safetensors files without mlx-lm's loader: tensor names and shapes from the header
(no tensor data), and all tensors of one file. Drafters that live beside or inside a checkpoint
(an MTP head, a Gemma 4 assistant) read their own tensors this way, since mlx-lm drops or never
loads them. Damaged files are one-line ModelErrors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import mlx.core as mx

from ..errors import ModelError


def tensor_shapes(folder: Path) -> dict[str, tuple[Path, list[int]]]:
    """name -> (file, shape) for every tensor in the folder's safetensors files."""
    out: dict[str, tuple[Path, list[int]]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                # the header is JSON of at most 100 MB (the format's own limit) inside the file
                if n > min(100 << 20, f.stat().st_size - 8):
                    raise ValueError("header length out of range")
                header = json.loads(fh.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (OSError, struct.error, ValueError):
            raise ModelError(f"{f}: not a readable safetensors file") from None
        for name, meta in header.items():
            if name != "__metadata__" and isinstance(meta, dict):
                out[name] = (f, list(meta.get("shape", [])))
    return out


def load_tensors(f: Path) -> dict[str, mx.array]:
    """All tensors of one safetensors file; a damaged file is a one-line error, not a traceback."""
    try:
        return mx.load(str(f))
    except (OSError, RuntimeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"{f}: cannot read its tensors ({first})") from None


def load_named(tensors: dict[str, tuple[Path, str]]) -> dict[str, mx.array]:
    """name -> tensor for `tensors` (name -> (file, name stored in it)), each file read once."""
    files: dict[Path, dict] = {}
    out = {}
    for name, (f, stored) in tensors.items():
        if f not in files:
            files[f] = load_tensors(f)
        out[name] = files[f][stored]
    return out


def parameter_count(folder: Path, config: dict) -> int:
    """The model's parameters, from the headers alone: a quantized layer's packed uint32 weight
    counts as the values it packs (32 / bits each; config's `quantization`, per-layer overrides
    included), and its scales and biases are not parameters of the model."""
    shapes = tensor_shapes(folder)
    quant = config.get("quantization") or config.get("quantization_config") or {}
    total = 0
    for name, (_, shape) in shapes.items():
        module, _, leaf = name.rpartition(".")
        quantized = f"{module}.scales" in shapes
        if quantized and leaf in ("scales", "biases"):
            continue
        n = 1
        for d in shape:
            n *= d
        if quantized and leaf == "weight":
            bits = (quant.get(module) or {}).get("bits", quant.get("bits", 4)) if isinstance(quant, dict) else 4
            n = n * 32 // bits
        total += n
    return total

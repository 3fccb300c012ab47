"""Write a model as a float checkpoint (float16, bfloat16 or float32): an mlx-lm folder whose
linear layers are plain float weights, for measuring the CPU weight forms on a float model of a
real shape (this machine has no float checkpoint of the default model's family; the default
model's GGUF is Q4_1, so its float copy holds the Q4_1 values, dequantized exactly).

    python scripts/float_checkpoint.py OUT_DIR [--dtype float16] [-m MODEL]
    mlxcel bench -m OUT_DIR --cpu-weights auto,q8,f32 ...
    python scripts/weights_quality.py -m OUT_DIR --modes auto,q8
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from mlxcel_py.cpu import blas

blas.prepare()

import mlx.core as mx  # noqa: E402

from mlxcel_py.models import loading  # noqa: E402

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    ap.add_argument("-m", "--model", default=None, help="default: the default model")
    args = ap.parse_args()
    src = loading.resolve(args.model).path
    config = json.loads((src / "config.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix == ".json" and f.name != "config.json":
            shutil.copy(f, args.out / f.name)
    weights: dict[str, mx.array] = {}
    for f in sorted(src.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    quant = config.get("quantization") or {}  # mlx-lm's: group_size and bits, per-module overrides
    out = {}
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")]
        if name.endswith(".weight") and f"{base}.scales" in weights:
            q = quant.get(base) if isinstance(quant.get(base), dict) else quant
            w = mx.dequantize(
                w, weights[f"{base}.scales"], weights[f"{base}.biases"], group_size=q["group_size"], bits=q["bits"]
            )
        out[name] = w.astype(DTYPES[args.dtype]) if mx.issubdtype(w.dtype, mx.floating) else w
    mx.save_safetensors(str(args.out / "model.safetensors"), out)
    config = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    print(f"{args.out}: {src.name} as {args.dtype}, {sum(v.nbytes for v in out.values()) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()

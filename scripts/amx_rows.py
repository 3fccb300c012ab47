"""The row-exact matmul kernel on AMX tiles against its VNNI path, by block height.

For the default model's layer shapes (fused q/k/v, o, fused gate/up, down, the output layer; 4-bit,
groups of 32), the kernel's time per call (its own clock, `_qmm.kernel_time`) with AMX off and on,
for blocks of M rows, and whether the two outputs are bit-identical. `cpu_extension.AMX_ROWS` is
where AMX starts paying. Usage:

    python scripts/amx_rows.py [--rows 2,4,8,16,40,64,128] [--reps 50]

Prints a Markdown table on stdout. One run; the machine is shared, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxcel_py.cpu import blas  # noqa: E402

blas.prepare()

import mlx.core as mx  # noqa: E402

from mlxcel_py.cpu import extension as cpu_extension

SHAPES = {"q/k/v": (960, 576), "o": (576, 576), "gate/up": (3072, 576), "down": (576, 1536), "output": (49152, 576)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2,4,8,16,40,64,128")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    qmm, why = cpu_extension.kernel_status()
    if qmm is None or not qmm.amx_supported():
        sys.exit(
            f"needs the kernel with AMX tiles here (kernel: {why}; AMX: "
            f"{'yes' if qmm is not None and qmm.amx_supported() else 'no'})"
        )
    mx.random.seed(0)
    weights = {}
    for name, (n, k) in SHAPES.items():
        wq, s, b = mx.quantize(mx.random.normal((n, k)) * 0.05, group_size=32, bits=4)
        weights[name] = (qmm.repack(wq, 4), qmm.interleave(s), qmm.interleave(b))
    print("| rows | " + " | ".join(f"{k} VNNI / AMX us" for k in SHAPES) + " | all layers AMX speedup | same bits |")
    print("|---|" + "---|" * (len(SHAPES) + 2))
    try:
        for m in (int(r) for r in a.rows.split(",")):
            cells, total, same = [], [0.0, 0.0], True
            for name, (_, k) in SHAPES.items():
                w, s, b = weights[name]
                x = mx.random.normal((m, k))
                times, outs = [], []
                for amx in (0, 1):
                    qmm.set_amx_rows(amx)
                    outs.append(qmm.row_exact_qmm(x, w, s, b, 4))
                    mx.eval(outs[-1])
                    reps = max(3, a.reps // (10 if name == "output" else 1))
                    k0 = qmm.kernel_time()[0]
                    for _ in range(reps):
                        mx.eval(qmm.row_exact_qmm(x, w, s, b, 4))
                    times.append((qmm.kernel_time()[0] - k0) / reps)
                same = same and mx.array_equal(outs[0], outs[1]).item()
                # a forward runs each layer shape 30 times (the output layer once)
                weight = 1 if name == "output" else 30
                total[0] += times[0] * weight
                total[1] += times[1] * weight
                cells.append(f"{times[0] * 1e6:.0f} / {times[1] * 1e6:.0f}")
            print(f"| {m} | " + " | ".join(cells) + f" | {total[0] / total[1]:.2f}x | {'yes' if same else 'NO'} |")
    finally:
        qmm.set_amx_rows(cpu_extension.AMX_ROWS)


if __name__ == "__main__":
    main()

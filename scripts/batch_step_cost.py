"""Cost of one batched plain decode step (`batch.batched_step`) against a single sequence's step.

For B = 1, 2, 4, 8, 16 sequences (60-token contexts) on the default model (or -m MODEL), times a
step (median of --steps) and the part spent in the row-exact matmul kernel, and prints tokens per
second, the step's cost relative to one sequence's and the batch's speedup. Usage:

    python scripts/batch_step_cost.py [-m MODEL] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxcel_py import fastpath  # noqa: E402

fastpath.prepare()

import mlx.core as mx  # noqa: E402

from mlxcel_py import batch, loading  # noqa: E402
from mlxcel_py.cache import SequenceCache  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    m = loading.load(loading.resolve(a.model))
    print(f"weights: {m.dtype}; {batch.probe(m.model, m.vocab_size or 2).detail}")
    try:
        from mlxcel_py import _qmm

        kernel = _qmm.kernel_time
    except ImportError:
        kernel = lambda: (0.0, 0)  # noqa: E731
    print("| sequences | ms per step | matmul kernel ms | tok/s | step vs 1 sequence | tok/s vs 1 sequence |")
    print("|---|---|---|---|---|---|")
    base = None
    for B in (1, 2, 4, 8, 16):
        seqs = []
        for b in range(B):
            c = SequenceCache(m.model)
            c.prefill(list(range(100 + b, 160 + b)))
            seqs.append(c)
        times, kern = [], []
        for i in range(a.steps + 2):
            k0, t0 = kernel()[0], time.perf_counter()
            logits = batch.batched_step(m.model, seqs, [5] * B) if B > 1 else seqs[0].feed([5])
            mx.eval(mx.argmax(logits, axis=-1))
            if i >= 2:  # the first steps trace new shapes
                times.append(time.perf_counter() - t0)
                kern.append(kernel()[0] - k0)
        t, k = statistics.median(times), statistics.median(kern)
        base = base or t
        print(f"| {B} | {t * 1000:.1f} | {k * 1000:.1f} | {B / t:.1f} | {t / base:.2f}x | {B * base / t:.2f}x |")


if __name__ == "__main__":
    main()

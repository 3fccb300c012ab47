"""Cost of one batched forward (`batch.batched_forward`) against one sequence's, on this machine.

Plain steps: for B = 1, 2, 4, 8, 16 sequences (60-token contexts) on the default model (or
-m MODEL), a step's time (median of --steps) and the part spent in the row-exact matmul kernel,
tokens per second, the step's cost relative to one sequence's and the batch's speedup.
With --verify also verify blocks: B sequences x W rows verified in turn (one forward each, as
round-robin rounds do) against one batched forward. With --prompt-chunk also a step as serve runs
it under load: B sequences' 3-row verify blocks at a 400-token context, without and with a new
request's 64-token prompt chunk beside them, and the time in the matmul kernel and in attention.
Usage:

    python scripts/batch_step_cost.py [-m MODEL] [--steps 10] [--verify] [--prompt-chunk]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxcel_py.cpu import blas  # noqa: E402

blas.prepare()

import mlx.core as mx  # noqa: E402

from mlxcel_py.engine import batch  # noqa: E402
from mlxcel_py.engine.cache import SequenceCache  # noqa: E402
from mlxcel_py.models import loading


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--prompt-chunk", action="store_true")
    a = ap.parse_args()
    m = loading.load(loading.resolve(a.model))
    print(f"weights: {m.dtype}; {batch.probe(m.model, m.vocab_size or 2).detail}")
    try:
        from mlxcel_py.cpu import _qmm

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
    if a.verify:
        verify_blocks(m.model, a.steps)
    if a.prompt_chunk:
        prompt_chunk(m.model, a.steps)


def verify_blocks(model, steps: int) -> None:
    print("\n| sequences x rows | in turn ms | batched ms | batched speedup |")
    print("|---|---|---|---|")
    for B in (2, 4, 8):
        for W in (1, 4, 8):
            seqs = []
            for b in range(B):
                c = SequenceCache(model)
                c.prefill(list(range(100 + b, 160 + b)))
                seqs.append(c)
            blocks = [[5 + i for i in range(W)] for _ in range(B)]
            turn, together = [], []
            for i in range(steps + 2):
                t0 = time.perf_counter()
                for s, blk in zip(seqs, blocks):
                    mx.eval(s.feed(blk))
                    s.truncate(len(s.tokens) - W)
                t1 = time.perf_counter()
                mx.eval(batch.batched_forward(model, seqs, blocks))
                t2 = time.perf_counter()
                for s in seqs:
                    s.truncate(len(s.tokens) - W)
                if i >= 2:
                    turn.append(t1 - t0)
                    together.append(t2 - t1)
            a, b = statistics.median(turn), statistics.median(together)
            print(f"| {B} x {W} | {a * 1000:.1f} | {b * 1000:.1f} | {a / b:.2f}x |")


def prompt_chunk(model, steps: int) -> None:
    try:
        from mlxcel_py.cpu import _qmm

        clocks = lambda: (_qmm.kernel_time()[0], _qmm.attention_time())  # noqa: E731
    except ImportError:
        clocks = lambda: (0.0, 0.0)  # noqa: E731
    print("\n| step | ms | matmul kernel ms | attention ms |")
    print("|---|---|---|---|")
    for B in (1, 8):
        for chunk in (0, 64):
            seqs = []
            for b in range(B + (1 if chunk else 0)):
                c = SequenceCache(model)
                c.prefill([(7 * i + b) % 20000 + 100 for i in range(400 if b < B else 30)])
                seqs.append(c)
            blocks = [[5 + b] * 3 for b in range(B)] + ([[9] * chunk] if chunk else [])
            wants = [True] * B + ([False] if chunk else [])
            times, kern, att = [], [], []
            for i in range(steps + 2):
                (k0, a0), t0 = clocks(), time.perf_counter()
                mx.eval([r for r in batch.batched_forward(model, seqs, blocks, wants) if r is not None])
                t1, (k1, a1) = time.perf_counter(), clocks()
                for s, blk in zip(seqs, blocks):
                    s.truncate(len(s.tokens) - len(blk))
                if i >= 2:
                    times.append(t1 - t0)
                    kern.append(k1 - k0)
                    att.append(a1 - a0)
            what = f"{B} x 3 rows" + (f" + a {chunk}-row prompt chunk" if chunk else "")
            print(
                f"| {what} | {statistics.median(times) * 1000:.1f} | {statistics.median(kern) * 1000:.1f} | "
                f"{statistics.median(att) * 1000:.1f} |"
            )


if __name__ == "__main__":
    main()

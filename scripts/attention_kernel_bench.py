"""The attention kernel alone, at each KV cache type: microseconds a layer for the default
model's shapes (9 query heads, 3 KV heads, head dim 64) over S keys, L query rows at a time.

    python scripts/attention_kernel_bench.py --keys 6000 --rows 1 --threads 2

Rounds interleave the types; the median is printed. For an A/B of two builds of the extension,
run it from two checkouts in turn (the numbers move with the machine's load: compare ratios
from runs side by side, not absolute times).
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from mlxcel_py.cpu.extension import kernel_status

TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")


def _stored(qmm, x: mx.array, kind: str) -> mx.array:
    if kind == "f32":
        return x
    if kind in ("f16", "bf16"):
        return x.astype(mx.float16 if kind == "f16" else mx.bfloat16)
    return qmm.kv_rows(x, mx.int8 if kind == "q8_0" else mx.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=6000)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--types", default=",".join(TYPES))
    args = parser.parse_args()
    qmm, why = kernel_status()
    if qmm is None:
        raise SystemExit(f"error: the kernel is not available: {why}")
    qmm.set_threads(args.threads)
    kinds = args.types.split(",")
    mx.random.seed(0)
    q = mx.random.normal((1, 9, args.rows, 64))
    k, v = mx.random.normal((1, 3, args.keys, 64)), mx.random.normal((1, 3, args.keys, 64))
    rows = {kind: (_stored(qmm, k, kind), _stored(qmm, v, kind)) for kind in kinds}
    mx.eval(*[x for pair in rows.values() for x in pair])
    calls = max(20, 300 // args.rows)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind in kinds:
            kk, vv = rows[kind]
            for _ in range(3):
                mx.eval(qmm.row_exact_attention(q, kk, vv, 0.125, True))
            start = time.perf_counter()
            for _ in range(calls):
                mx.eval(qmm.row_exact_attention(q, kk, vv, 0.125, True))
            times[kind].append((time.perf_counter() - start) / calls)
    print(f"{qmm.isa()} build, {args.threads} threads, {args.keys} keys, {args.rows} rows, median of {args.rounds}")
    base = statistics.median(times[kinds[0]])
    for kind in kinds:
        t = statistics.median(times[kind])
        print(f"{kind:>5}: {t * 1e6:8.0f} us a layer  {base / t:5.2f}x {kinds[0]}")


if __name__ == "__main__":
    main()

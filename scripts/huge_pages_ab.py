"""The decode step with the kernel's weights in huge pages against MLX's own buffers, in one process.

    python scripts/huge_pages_ab.py [-m FILE.gguf] [--threads 1,2] [--block 16] [--blocks 60] [--json out.json]

Loads the model once with MLX's buffers (MLXCEL_NO_HUGE_PAGES=1), keeps those arrays, moves a
copy into huge-page arenas (`cpu.weights.huge_pages`), then decodes blocks of --block greedy
tokens from the same cache position, alternating the two sets of weights block by block (the
fused layers are rebuilt on each switch): a shared machine's drift, which moves a whole run by
20-30% here, hits both alike. Prints each set's median tok/s and the median, mean and quartiles
of the per-block ratio (huge / plain), and checks that both decode the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ["MLXCEL_NO_HUGE_PAGES"] = "1"  # the load keeps MLX's buffers; the arena copy is made below

from mlxcel_py.cpu import blas  # noqa: E402

blas.prepare()

import mlx.core as mx  # noqa: E402
from decode_step import PROMPT, greedy_steps  # noqa: E402  (this folder: the same prompt and loop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=60)
    ap.add_argument("--json")
    a = ap.parse_args()

    import mlxcel_py as mc
    from mlxcel_py.cpu import extension as cpu_extension
    from mlxcel_py.cpu import layers as cpu_layers
    from mlxcel_py.cpu import weights as cpu_weights
    from mlxcel_py.engine.cache import SequenceCache
    from mlxcel_py.models import decoder_layers

    model = mc.load(a.model, warmup=False)
    qmm, why = cpu_extension.kernel_status()
    if qmm is None:
        sys.exit(f"the row-exact kernel is not in use: {why}")
    inner = model.model
    slots = [
        (m, k)
        for _, m in inner.named_modules()
        if isinstance(m, cpu_layers.KERNEL_LINEARS)
        for k in ("weight", "scales", "biases", "bias")
        if k in m
    ]
    plain = [m[k] for m, k in slots]
    del os.environ["MLXCEL_NO_HUGE_PAGES"]
    size, huge = cpu_weights.huge_pages(inner)
    print(f"arenas {size / 2**20:.0f} MiB, {huge / 2**20:.0f} MiB of it in huge pages", file=sys.stderr)
    arena = [m[k] for m, k in slots]

    def use(arrays: list) -> None:
        for (m, k), x in zip(slots, arrays):
            m[k] = x
        decoder_layers.install(inner)

    ids = model.encode(PROMPT)
    report = {}
    for threads in [int(t) for t in a.threads.split(",")]:
        qmm.set_threads(threads)
        cache = SequenceCache(inner)
        first = int(mx.argmax(cache.feed(ids)[-1]).item())
        base = len(cache.tokens)
        speeds: dict[str, list[float]] = {"plain": [], "huge": []}
        tokens: dict[str, list[int]] = {}
        for b in range(a.blocks):
            order = [("plain", plain), ("huge", arena)]
            for name, arrays in order if b % 2 == 0 else order[::-1]:
                use(arrays)
                cache.truncate(base)
                t = time.perf_counter()
                out = greedy_steps(cache, first, a.block)
                speeds[name].append(a.block / (time.perf_counter() - t))
                if tokens.setdefault(name, out) != out:
                    sys.exit(f"{name}: a block decoded other tokens than the first")
        if tokens["plain"] != tokens["huge"]:
            sys.exit("the huge-page weights decoded other tokens")
        ratios = [h / p for p, h in zip(speeds["plain"], speeds["huge"])]
        q1, _, q3 = statistics.quantiles(ratios)
        row = {
            "plain_tps": statistics.median(speeds["plain"]),
            "huge_tps": statistics.median(speeds["huge"]),
            "ratio_median": statistics.median(ratios),
            "ratio_mean": statistics.mean(ratios),
            "ratio_q1": q1,
            "ratio_q3": q3,
        }
        report[f"{threads}t"] = row
        print(
            f"{threads} thread(s): plain {row['plain_tps']:.1f} tok/s, huge pages {row['huge_tps']:.1f}; "
            f"per-block ratio median {row['ratio_median']:.3f} (mean {row['ratio_mean']:.3f}, "
            f"quartiles {q1:.3f}-{q3:.3f})"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"model": a.model, "block": a.block, "blocks": a.blocks, **report}, indent=2)
        )


if __name__ == "__main__":
    main()

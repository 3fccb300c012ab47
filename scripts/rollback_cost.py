#!/usr/bin/env python
"""What rolling back costs: a verify round that keeps part of its block against one that keeps all.

Builds the tests' tiny random Qwen3.5 hybrid (3 Gated DeltaNet layers + 1 attention layer) and a
tiny llama of the same width, then times, interleaved, for each model:
  full       verify [last + 7 drafts], all kept (no rollback), then the next plain step
  steps      the same block keeping 3 drafts; the Gated DeltaNet layers take the recorded state
             after the last kept step (the engine's choice), the attention layer is trimmed
  deferred   the same, rolled back through the checkpoint: states restored, the kept tokens
             replayed in front of the next forward (what every other recurrent family gets)
  immediate  the same, but the kept tokens are replayed at once (an extra forward)
Each sample is one round plus the following plain step, since a deferred replay lands there.
Usage: python scripts/rollback_cost.py [--rounds 200]. Prints milliseconds (medians) and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from mlxcel_py.cpu import blas  # noqa: E402

blas.prepare()

import mlx.core as mx  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()

    import tiny_models
    from conftest import make_tiny_model

    from mlxcel_py.engine.cache import SequenceCache
    from mlxcel_py.models import loading
    from mlxcel_py.models.cache_kinds import describe_kinds

    tmp = Path(tempfile.mkdtemp())
    models = {
        "qwen3_5 hybrid": tiny_models.build(tmp / "hybrid", tiny_models.QWEN35),
        "llama (trim only)": make_tiny_model(tmp / "llama", hidden=64, layers=4),
    }
    prompt = list(range(3, 200))
    draft = [7, 8, 9, 10, 11, 12, 13]
    for name, folder in models.items():
        model = loading.load(loading.resolve(str(folder))).model
        caches = {}
        for mode, steps in (("full", True), ("steps", True), ("deferred", False), ("immediate", False)):
            SequenceCache.use_steps = steps
            caches[mode] = SequenceCache(model)
            caches[mode].prefill(prompt)
        SequenceCache.use_steps = True
        times: dict[str, list[float]] = {mode: [] for mode in caches}
        base = len(prompt)
        for _ in range(args.rounds):
            for mode, cache in caches.items():
                t = time.perf_counter()
                cache.mark()
                mx.eval(cache.feed([1, *draft]))
                keep = len(draft) if mode == "full" else 3
                assert cache.truncate(base + 1 + keep)
                if mode == "immediate":
                    cache.settle()
                mx.eval(cache.feed([5]))
                cache.eval()
                times[mode].append(time.perf_counter() - t)
                assert cache.truncate(base)  # back to the prompt through the checkpoint, untimed
                cache.release()
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(f"{name} ({describe_kinds(caches['full'].layers)}), {args.rounds} rounds, width 8, keep 4 of 8:")
        for k, v in med.items():
            print(f"  {k:9s} {v:7.3f} ms  ({v / med['full']:.2f}x full accept)")


if __name__ == "__main__":
    main()

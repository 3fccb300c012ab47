"""Peak memory of a long context at each KV cache type: the default model, one process a type.

    python scripts/kv_memory.py [--context 32768] [--types f32,f16,q8_0] [--tokens 8] [--json out.json]

Each type runs in a fresh process (so one run's peak is not another's): the model loads at that
type (`--cache-type-k/-v`), prefills `--context` tokens (the filler text of scripts/decode_step.py)
in the engine's chunks, decodes `--tokens` greedy tokens, and reports the process's peak resident
memory (ru_maxrss: weights, cache, MLX's buffers and Python alike), MLX's own peak allocation
(mx.get_peak_memory) and the cache's bytes (its buffers, reserved rows included). Prints a Markdown
table with each figure's ratio to the first type's. The default model is trained for 8,192
positions: past that the text means nothing, but the bytes are what a long context costs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def one(kind: str, context: int, tokens: int) -> dict:
    from mlxcel_py.cpu import blas

    blas.prepare()
    import mlx.core as mx
    from decode_step import greedy_steps, prompt_ids

    import mlxcel_py as mc
    from mlxcel_py.engine.cache import SequenceCache

    model = mc.load(cache_type_k=kind, cache_type_v=kind, warmup=False)
    ids = prompt_ids(model, context)
    cache = SequenceCache(model.model)
    cache.prefill(ids[:-1])
    tok = int(mx.argmax(cache.feed(ids[-1:])[-1]).item())
    greedy_steps(cache, tok, tokens)
    held = sum(c.keys.nbytes + c.values.nbytes for c in cache.layers)
    return {
        "type": kind,
        "kv_cache": model.session.target.kv_cache,
        "context": len(ids),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "mlx_peak_mib": mx.get_peak_memory() / 2**20,
        "cache_mib": held / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one type
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.context, a.tokens)))
        return
    rows = []
    for kind in a.types.split(","):
        cmd = [sys.executable, __file__, "--one", kind, "--context", str(a.context), "--tokens", str(a.tokens)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(f"{kind}: {rows[-1]}", file=sys.stderr)
    base = rows[0]
    print(f"\n{base['context']}-token context, then {a.tokens} greedy tokens; one process a type\n")
    print("| cache type | cache MiB | peak RSS MiB | vs first | MLX peak MiB | vs first |\n|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['type']} | {r['cache_mib']:.0f} | {r['peak_rss_mib']:.0f} | {r['peak_rss_mib'] / base['peak_rss_mib']:.2f}x "
            f"| {r['mlx_peak_mib']:.0f} | {r['mlx_peak_mib'] / base['mlx_peak_mib']:.2f}x |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

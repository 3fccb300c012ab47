#!/usr/bin/env python
"""Plain-decode tok/s: mlxcel-py vs stock mlx-lm on the default model, in one run.

Stock mlx-lm runs in a subprocess exactly as a user gets it (`mlx_lm.stream_generate` on the
converted folder: bundled reference BLAS, quantized weights as stored). mlxcel-py runs its own
engine with its CPU fast path (OpenBLAS, float32 weights). Same prompts, greedy, same length.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STOCK = r"""
import json, sys
import mlx_lm
from mlx_lm.sample_utils import make_sampler
path, n, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
model, tok = mlx_lm.load(path)
out = []
for i, p in enumerate(prompts + prompts[:1]):
    ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
    for r in mlx_lm.stream_generate(model, tok, ids, max_tokens=n, sampler=make_sampler(0.0)):
        pass
    if i < len(prompts) or not out:  # the first prompt runs twice: the first pass is warmup
        out.append((r.generation_tokens, r.generation_tps))
print(json.dumps(out[1:] if len(out) > len(prompts) else out))
"""

PROMPTS = ["Write a story about a lighthouse keeper.", "Explain how a bicycle works.",
           "Give me five tips for learning to cook."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()

    from mlxcel_py import fastpath

    fastpath.prepare()
    from mlxcel_py import loading
    from mlxcel_py.engine import Engine
    from mlxcel_py.prompting import prompt_ids

    resolved = loading.resolve(None)
    env = {k: v for k, v in __import__("os").environ.items()}
    stock = subprocess.run([sys.executable, "-c", STOCK, str(resolved.path), str(args.max_tokens), json.dumps(PROMPTS)],
                           capture_output=True, text=True, env=env, check=True)
    stock_rows = json.loads(stock.stdout.strip().splitlines()[-1])
    lm = loading.load(resolved)
    eng = Engine(lm.model, eos_ids=lm.tokenizer.eos_token_ids, vocab_size=lm.vocab_size,
                 context_length=lm.context_length)
    eng.warmup()
    ours = []
    for p in PROMPTS:
        g = eng.generate(prompt_ids(lm.tokenizer, p), max_tokens=args.max_tokens)
        for _ in g:
            pass
        ours.append((g.stats.generated_tokens, g.stats.decode_tps))
    print("| prompt | stock mlx-lm tok/s | mlxcel-py tok/s | ratio |")
    print("|---|---|---|---|")
    ratios = []
    for p, (sn, st), (on, ot) in zip(PROMPTS, stock_rows, ours):
        ratios.append(ot / st)
        print(f"| {p[:40]} | {st:.1f} ({sn} tok) | {ot:.1f} ({on} tok) | {ot / st:.2f}x |")
    print(f"\nmlxcel-py plain decode / stock mlx-lm: median {sorted(ratios)[len(ratios) // 2]:.2f}x "
          f"(BLAS {fastpath.state().name}, weights {lm.dtype})")


if __name__ == "__main__":
    main()

"""Does a suffix store of the target's own answers help on prose it has not seen?

    python scripts/suffix_own_answers.py [--answers 400] [--answer-tokens 256] [--tokens 128]

The default model answers `--answers` of the drafter-training prompts (training/corpus.py, shuffled
with seed 0) greedily; each prompt and answer goes into the suffix drafter's store (SuffixDecoding
over earlier outputs: a small model's replies repeat its own phrases across subjects). Then every
prompt of benchmarks/prose.jsonl, whose subjects the training prompts do not hold, decodes plainly
and with the suffix drafter, interleaved twice; the outputs must be identical. Prints decode tok/s
of each, the speedup, and the drafts accepted of those proposed. Ratios only: the host is shared.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlxcel_py as mc  # noqa: E402
from mlxcel_py.training import corpus  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=400, help="training prompts answered into the store")
    ap.add_argument("--answer-tokens", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per timed prose reply")
    args = ap.parse_args()

    model = mc.load(draft_kind="suffix", suffix_cache_tokens=5_000_000)
    eng = model.engine
    prompts = corpus.builtin()
    random.Random(0).shuffle(prompts)
    t0, stored = time.time(), 0
    for p in prompts[: args.answers]:
        ids = model.encode(p)
        g = eng.generate(ids, max_tokens=args.answer_tokens, speculative=False, remember=False)
        for _ in g:
            pass
        eng.remember(list(ids) + list(g.tokens))
        stored += len(g.tokens)
    print(f"store: {args.answers} answers, {stored} tokens, {time.time() - t0:.0f} s", file=sys.stderr)

    items = [json.loads(line) for line in (ROOT / "benchmarks" / "prose.jsonl").read_text().splitlines() if line]
    tokens = {"plain": 0, "suffix": 0}
    seconds = {"plain": 0.0, "suffix": 0.0}
    accepted = proposed = identical = 0
    for it in items:
        ids = model.encode(it["prompt"])
        outs = {}
        for mode in ("plain", "suffix", "plain", "suffix"):
            g = eng.generate(ids, max_tokens=args.tokens, speculative=mode == "suffix", remember=False)
            for _ in g:
                pass
            outs[mode] = list(g.tokens)
            tokens[mode] += len(g.tokens)
            seconds[mode] += g.stats.decode_s
            if mode == "suffix":
                accepted, proposed = accepted + g.stats.accepted, proposed + g.stats.proposed
        identical += outs["plain"] == outs["suffix"]
    rate = {m: tokens[m] / seconds[m] for m in tokens}
    print(
        f"plain {rate['plain']:.1f} tok/s, suffix {rate['suffix']:.1f} tok/s: {rate['suffix'] / rate['plain']:.2f}x; "
        f"accepted {accepted} of {proposed} drafts; identical {identical}/{len(items)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

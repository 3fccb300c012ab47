#!/usr/bin/env python
"""Plain vs prompt-lookup decode on ../shared/workloads/public.jsonl, one process, interleaved.

Prints per-prompt rows and a per-kind median table (markdown with --markdown). Ratios, not
absolute times, are what to quote: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxcel_py import fastpath  # noqa: E402

fastpath.prepare()

from mlxcel_py import loading  # noqa: E402
from mlxcel_py.engine import Engine  # noqa: E402
from mlxcel_py.options import DraftConfig, LookupConfig  # noqa: E402
from mlxcel_py.prompting import prompt_ids  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    shared = ROOT.parent / "shared" / "workloads" / "public.jsonl"
    ap.add_argument("--workload", default=str(shared if shared.exists() else ROOT / "benchmarks" / "workloads.jsonl"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--policy", default="auto")
    ap.add_argument("--max-draft", type=int, default=7)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    lm = loading.load(loading.resolve(args.model))
    items = [json.loads(line) for line in Path(args.workload).read_text().splitlines() if line.strip()]
    common = dict(eos_ids=lm.tokenizer.eos_token_ids, vocab_size=lm.vocab_size, context_length=lm.context_length)
    plain = Engine(lm.model, **common)
    spec = Engine(lm.model, **common, draft=DraftConfig(kind="prompt-lookup", lookup=LookupConfig(
        max_draft=args.max_draft, policy=args.policy)))
    spec.warmup(calibrate=args.policy == "cost")
    plain.warmup()
    rows = []
    for item in items:
        ids = prompt_ids(lm.tokenizer, item["prompt"])
        g1 = plain.generate(ids, max_tokens=args.max_tokens)
        a = [e.token for e in g1]
        g2 = spec.generate(ids, max_tokens=args.max_tokens)
        b = [e.token for e in g2]
        s1, s2 = g1.stats, g2.stats
        row = dict(kind=item["kind"], source=item["source"], tokens=len(a), plain_tps=s1.decode_tps,
                   spec_tps=s2.decode_tps, speedup=s2.decode_tps / s1.decode_tps if s1.decode_tps else 0.0,
                   identical=a == b, acceptance=s2.acceptance_rate, tokens_per_verify=s2.tokens_per_forward,
                   mean_accepted=s2.mean_accepted_prefix, drafted_rounds=s2.drafted_rounds, rounds=s2.rounds)
        rows.append(row)
        print(f"{row['kind']:9} {row['source'][:22]:22} n={row['tokens']:4d} plain {row['plain_tps']:6.1f} "
              f"spec {row['spec_tps']:6.1f} x{row['speedup']:.2f} acc {row['acceptance']:.2f} "
              f"tpv {row['tokens_per_verify']:.2f} same={row['identical']}", file=sys.stderr, flush=True)
    kinds = sorted({r["kind"] for r in rows})
    lines = ["| kind | prompts | median plain tok/s | median prompt-lookup tok/s | median speedup | outputs identical |",
             "|---|---|---|---|---|---|"]
    for k in kinds:
        rs = [r for r in rows if r["kind"] == k]
        lines.append(f"| {k} | {len(rs)} | {statistics.median(r['plain_tps'] for r in rs):.1f} | "
                     f"{statistics.median(r['spec_tps'] for r in rs):.1f} | "
                     f"{statistics.median(r['speedup'] for r in rs):.2f}x | {sum(r['identical'] for r in rs)}/{len(rs)} |")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

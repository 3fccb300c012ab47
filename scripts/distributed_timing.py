"""Time per token of one process against 2 local ranks, and the bytes the ranks exchange.

Runs the real CLI, interleaved: `mlxcel generate --profile` alone (float32 weights, and `auto`,
what the ranks run too) and under `mlxcel launch -n 2` with --pp-size 2 or --tp-size 2 (the
default model's 9 heads rule out --tp-size 2 on it; pass -m for a model whose heads divide). Each
configuration runs --repeats times and keeps the median decode speed. Usage:

    python scripts/distributed_timing.py [-m MODEL] [--max-tokens 128] [--repeats 3] [--tp] [--json FILE]

Prints a Markdown table on stdout. On one machine the ranks share its cores: this proves the
mechanics and measures their cost, not a speedup (that needs a second machine's cores and memory).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys

PROMPT = "Explain in a few paragraphs how a bicycle stays upright while it moves."
DECODE = re.compile(r"Decode:\s+([\d.]+) ms \(([\d.]+) tok/s\)")
TRAFFIC = re.compile(r"([\d.]+) KiB over (\d+) token rows \(([\d.]+) KiB per token\)")


def once(argv: list[str]) -> dict:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}")
    err = " ".join(r.stderr.split())
    m = DECODE.search(err)
    t = TRAFFIC.search(err)
    gen = int(re.search(r"Generated tokens: (\d+)", err).group(1))
    out = {"tok_s": float(m.group(2)), "ms_per_token": float(m.group(1)) / max(gen, 1), "tokens": gen, "text": r.stdout}
    if t:
        out.update(kib=float(t.group(1)), rows=int(t.group(2)), kib_per_token=float(t.group(3)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tp", action="store_true", help="--tp-size 2 instead of --pp-size 2")
    ap.add_argument("--json")
    a = ap.parse_args()
    me = [sys.executable, "-m", "mlxcel_py"]
    gen = ["generate", "-p", PROMPT, "-n", str(a.max_tokens), "--ignore-eos", "--profile"]
    if a.model:
        gen += ["-m", a.model]
    layout = ["--tp-size" if a.tp else "--pp-size", "2"]
    configs = {
        "1 process, f32": me + gen + ["--cpu-weights", "f32"],
        "1 process, auto": me + gen,
        f"2 ranks, {layout[0]} 2": me + ["launch", "-n", "2", "--", "mlxcel"] + gen + layout,
    }
    if a.tp:  # mlx-lm's own split (row-parallel halves summed), what --tp-size ran before exact_tp
        configs["2 ranks, --tp-size 2, f32"] = configs[f"2 ranks, {layout[0]} 2"] + ["--cpu-weights", "f32"]
    runs: dict[str, list[dict]] = {k: [] for k in configs}
    for _ in range(a.repeats):
        for name, argv in configs.items():
            runs[name].append(once(argv))
    rows = []
    base = statistics.median(r["ms_per_token"] for r in runs["1 process, f32"])
    for name, rs in runs.items():
        best = sorted(rs, key=lambda r: r["ms_per_token"])[len(rs) // 2]
        rows.append(
            {"config": name, **{k: v for k, v in best.items() if k != "text"}, "vs_f32": base / best["ms_per_token"]}
        )
    alone = "1 process, auto"  # what the ranks' layers compute
    same = runs[alone][0]["text"] == runs[f"2 ranks, {layout[0]} 2"][0]["text"]
    print("| configuration | ms per token | tok/s | vs 1 process f32 | exchanged per token |")
    print("|---|---|---|---|---|")
    for r in rows:
        ex = f"{r['kib_per_token']:.2f} KiB" if "kib_per_token" in r else "-"
        print(f"| {r['config']} | {r['ms_per_token']:.1f} | {r['tok_s']:.2f} | {r['vs_f32']:.2f}x | {ex} |")
    print(
        f"\n{a.max_tokens} tokens, median of {a.repeats} interleaved runs; 2-rank output identical to "
        f"the {alone.split(', ')[1]} 1-process output: {same}"
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {
                    "rows": rows,
                    "identical_to": alone,
                    "identical": same,
                    "max_tokens": a.max_tokens,
                    "repeats": a.repeats,
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()

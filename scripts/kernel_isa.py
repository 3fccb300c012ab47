"""Plain decode on the kernel's builds and on float32, side by side (MLXCEL_KERNEL_ISA).

Runs `mlxcel generate --profile` (default model, greedy) under MLXCEL_KERNEL_ISA=avx512, avxvnni,
avx2 (those this CPU runs) and f32 in turn, interleaved, and reports the median prefill and decode
speed of each, the decode ratio against f32, and whether they gave the same text (the kernel's
builds must: they compute the same bits; f32 may differ where int8 activations round
differently). Run from `make test-avxvnni`'s tree (build/avxvnni-evex/tree) on a CPU with
AVX-512 VNNI and without AVX-VNNI, the avxvnni row is the test build's EVEX vpdpbusd: a stand-in
for an AVX-VNNI CPU's speed, not a measurement of one. With --busy, a
`nice -n 19` busy loop runs beside every run, as a user's other programs would. Usage:

    python scripts/kernel_isa.py [--runs 3] [--tokens 128] [--threads 1,2] [--busy] [--json FILE]

Prints a Markdown table on stdout. One run; the machine is shared, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def builds() -> tuple[str, ...]:
    """The kernel's builds this CPU runs, best first, then f32 (no kernel)."""
    from mlxcel_py.cpu import extension as cpu_extension

    qmm, _ = cpu_extension.kernel_status()
    return (*(isa for isa in cpu_extension.KERNEL_ISAS[:-1] if qmm is not None and qmm.isa_supported(isa)), "f32")


def one_run(isa: str, threads: int, tokens: int) -> tuple[float, float, str]:
    env = dict(os.environ, MLXCEL_KERNEL_ISA=isa, MLXCEL_KERNEL_THREADS=str(threads))
    cmd = [sys.executable, "-m", "mlxcel_py", "generate", "--prompt", PROMPT, "-n", str(tokens), "--temp", "0"]
    r = subprocess.run([*cmd, "--profile"], env=env, capture_output=True, text=True, timeout=600, check=True)
    prefill = float(re.search(r"Prefill:.*\(([\d.]+) tok/s\)", r.stderr).group(1))
    decode = float(re.search(r"Decode:.*\(([\d.]+) tok/s\)", r.stderr).group(1))
    return prefill, decode, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--busy", action="store_true", help="a nice -n 19 busy loop beside every run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    isas = builds()
    busy = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"]) if args.busy else None
    rows = []
    try:
        for threads in [int(t) for t in args.threads.split(",")]:
            got: dict[str, list[tuple[float, float, str]]] = {isa: [] for isa in isas}
            for _ in range(args.runs):
                for isa in isas:  # interleaved: a noisy moment hits every build alike
                    got[isa].append(one_run(isa, threads, args.tokens))
            f32 = statistics.median(d for _, d, _ in got["f32"])
            texts = {isa: {t for _, _, t in runs} for isa, runs in got.items()}
            first = isas[0]
            for isa in isas:
                decode = [d for _, d, _ in got[isa]]
                rows.append(
                    dict(
                        threads=threads,
                        isa=isa,
                        busy=args.busy,
                        prefill=statistics.median(p for p, _, _ in got[isa]),
                        decode=statistics.median(decode),
                        decode_runs=decode,
                        vs_f32=statistics.median(decode) / f32,
                        same_text_as_best=texts[isa] == texts[first],
                    )
                )
    finally:
        if busy is not None:
            busy.kill()
    print(
        f"| threads | build | prefill tok/s | decode tok/s (runs) | decode vs f32 | text = {isas[0]} |{' (busy)' if args.busy else ''}"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        runs = ", ".join(f"{d:.0f}" for d in r["decode_runs"])
        print(
            f"| {r['threads']} | {r['isa']} | {r['prefill']:.0f} | {r['decode']:.0f} ({runs}) | "
            f"{r['vs_f32']:.2f}x | {'yes' if r['same_text_as_best'] else 'no'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

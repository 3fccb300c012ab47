"""Concurrent clients against `mlxcel serve`: aggregate tokens/s and latency at 1, 2, 4, 8, 16 clients.

Starts its own server (extra arguments go to `mlxcel serve`, e.g. `-np 16 --draft-kind
prompt-lookup`), then sends every prompt of the public workload as a greedy chat request: first one
at a time (1 client), then from C concurrent clients sharing the same queue of requests. For each C:
wall time, aggregate generated tokens/s, p50/p95 request latency, the ratio to one client, verify
rounds, and whether every response equals its one-at-a-time response. Usage:

    python scripts/serve_bench.py [--clients 1,2,4,8,16] [--max-tokens 64] [--passes 1] [--json FILE] -- [serve args]

--passes N sends the workload N times over (N x 16 requests): with one pass, the clients run out of
work while the longest requests are still decoding, so the end of the run measures those alone;
more passes weigh the server's steady state. Repeated prompts would be served from the prompt
cache, so pass `--cache-ram 0` to the server to compute every prompt in full.

Prints a Markdown table on stdout. One run; the machine is shared, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def workload() -> list[dict]:
    for path in (ROOT.parent / "shared" / "workloads" / "public.jsonl", ROOT / "benchmarks" / "workloads.jsonl"):
        if path.exists():
            return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    sys.exit("no workload file")


def start(serve_args: list[str]) -> tuple[subprocess.Popen, str, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "mlxcel_py", "serve", "--port", "0", *serve_args],
                            stderr=subprocess.PIPE, text=True)
    lines = []
    while True:
        line = proc.stderr.readline()
        if not line:
            sys.exit("server did not start:\n" + "".join(lines))
        lines.append(line)
        m = re.search(r"listening on (http://[\d.:]+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1), lines


def run(url: str, items: list[dict], clients: int, max_tokens: int) -> dict:
    work: queue.Queue = queue.Queue()
    for i, it in enumerate(items):
        work.put((i, it))
    out: list = [None] * len(items)

    def client() -> None:
        with httpx.Client(timeout=1800) as http:
            while True:
                try:
                    i, it = work.get_nowait()
                except queue.Empty:
                    return
                t = time.perf_counter()
                r = http.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": it["prompt"]}], "max_tokens": max_tokens,
                    "temperature": 0}).json()
                out[i] = {"latency": time.perf_counter() - t, "text": r["choices"][0]["message"]["content"],
                          "tokens": r["usage"]["completion_tokens"], "timings": r.get("timings", {}),
                          "kind": it.get("kind", "")}

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    lat = sorted(o["latency"] for o in out)
    return {"clients": clients, "wall_s": wall, "tokens": sum(o["tokens"] for o in out),
            "tok_s": sum(o["tokens"] for o in out) / wall, "p50_s": statistics.median(lat),
            "p95_s": lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))],
            "draft_rounds": sum(o["timings"].get("draft_rounds", 0) for o in out), "responses": out}


def main() -> None:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    items = workload() * max(1, a.passes)
    proc, url, lines = start(serve_args)
    try:
        httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 4, "temperature": 0}, timeout=600)
        results = [run(url, items, int(c), a.max_tokens) for c in a.clients.split(",")]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    base = results[0]
    passes = f" ({a.passes} passes over the workload)" if a.passes > 1 else ""
    print(f"serve {' '.join(serve_args)}; {len(items)} public-workload prompts{passes}, greedy, max {a.max_tokens} "
          f"tokens each; one run\n")
    print("| clients | wall s | generated tok/s | vs 1 client | p50 latency s | p95 latency s | verify rounds | "
          "same text as 1 client |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        same = sum(x["text"] == y["text"] for x, y in zip(r["responses"], base["responses"]))
        r["identical"] = same
        print(f"| {r['clients']} | {r['wall_s']:.1f} | {r['tok_s']:.1f} | {r['tok_s'] / base['tok_s']:.2f}x | "
              f"{r['p50_s']:.1f} | {r['p95_s']:.1f} | {r['draft_rounds']} | {same}/{len(items)} |")
    copy = [i for i, it in enumerate(items) if it.get("kind") in ("edit", "reformat")]
    if copy:
        print("\nCopy-heavy requests (edit, reformat), median decode tok/s per request (server `timings`):")
        for r in results[:3]:
            speeds = [r["responses"][i]["timings"].get("predicted_per_second", 0.0) for i in copy]
            print(f"- {r['clients']} client(s): {statistics.median(speeds):.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"serve_args": serve_args, "max_tokens": a.max_tokens, "passes": a.passes,
                                            "results": results, "startup": lines}, indent=1))


if __name__ == "__main__":
    main()

"""Concurrent clients against `mlxcel serve`: aggregate tokens/s and latency at 1, 2, 4, 8, 16 clients.

Starts its own server (extra arguments go to `mlxcel serve`, e.g. `-np 16 --draft-kind
prompt-lookup`), then sends every prompt of the public workload as a greedy chat request: first one
at a time (1 client), then from C concurrent clients sharing the same queue of requests. For each C:
wall time, aggregate generated tokens/s, p50/p95 request latency, the ratio to one client, verify
rounds, and whether every response equals its one-at-a-time response. Usage:

    python scripts/serve_bench.py [--clients 1,2,4,8,16] [--max-tokens 64] [--passes 1] [--sustained]
                                  [--json FILE] [--llama-server PATH] -- [serve args]

--llama-server PATH runs llama.cpp's own server instead (built from its source, as
scripts/vs_llama_server.py says), on the default model's GGUF unless the args after -- give -m:
the same requests, so its aggregate compares with ours from the same hour.

--passes N sends the workload N times over (N x 16 requests): with one pass, the clients run out of
work while the longest requests are still decoding, so the end of the run measures those alone;
more passes weigh the server's steady state. --sustained keeps C clients busy instead: each client
sends the whole workload (N times with --passes), client i starting at prompt i x 16 / C, so C
requests are in flight until the last client's last request and the mix in flight stays that of the
workload; throughput (generated tokens over wall time) is compared with one client sending the
workload once. Repeated prompts would be served from the prompt cache, so pass `--cache-ram 0` to
the server to compute every prompt in full.

Prints a Markdown table on stdout. One run; the machine is shared, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import socket
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxcel_py", "serve", "--port", "0", *serve_args], stderr=subprocess.PIPE, text=True
    )
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_llama_server(binary: str, args: list[str]) -> tuple[subprocess.Popen, str, list[str]]:
    """llama.cpp's own llama-server with `args` (the default model's GGUF unless they give -m), on a
    free port, its log drained; ready once /health answers 200 (exits if it dies or takes 120 s)."""
    from mlxcel_py.models import default_model

    port = free_port()
    model = [] if "-m" in args else ["-m", str(default_model.default_gguf())]
    cmd = [binary, *model, "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep draining its log
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited ({proc.returncode}): {' '.join(cmd)}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, [" ".join(cmd)]
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("llama-server did not become healthy")


def run(url: str, items: list[dict], clients: int, max_tokens: int, sustained: int = 0) -> dict:
    """C clients; with sustained=N each sends the whole of `items` N times from its own offset,
    else they share one queue of `items`. Every response carries its prompt's index in `items`."""
    work: queue.Queue = queue.Queue()
    if sustained:
        n = len(items)
        plans = [
            [(j % n, items[j % n]) for j in range(c * n // clients, c * n // clients + n * sustained)]
            for c in range(clients)
        ]
    else:
        for i, it in enumerate(items):
            work.put((i, it))
    out: list = []

    def client(c: int) -> None:
        plan = iter(plans[c]) if sustained else None
        with httpx.Client(timeout=1800) as http:
            while True:
                try:
                    i, it = next(plan) if plan is not None else work.get_nowait()
                except (queue.Empty, StopIteration):
                    return
                t = time.perf_counter()
                r = http.post(
                    url + "/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": it["prompt"]}],
                        "max_tokens": max_tokens,
                        "temperature": 0,
                    },
                ).json()
                out.append(
                    {
                        "index": i,
                        "latency": time.perf_counter() - t,
                        "text": r["choices"][0]["message"]["content"],
                        "tokens": r["usage"]["completion_tokens"],
                        "timings": r.get("timings", {}),
                        "kind": it.get("kind", ""),
                    }
                )

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    out.sort(key=lambda o: o["index"])
    lat = sorted(o["latency"] for o in out)
    return {
        "clients": clients,
        "wall_s": wall,
        "tokens": sum(o["tokens"] for o in out),
        "tok_s": sum(o["tokens"] for o in out) / wall,
        "p50_s": statistics.median(lat),
        "p95_s": lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))],
        "draft_rounds": sum(o["timings"].get("draft_rounds", 0) for o in out),
        "responses": out,
    }


def main() -> None:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--sustained", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--llama-server", metavar="PATH", help="run llama.cpp's llama-server (the args after -- go to it)")
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    items = workload() * (1 if a.sustained else max(1, a.passes))
    proc, url, lines = start_llama_server(a.llama_server, serve_args) if a.llama_server else start(serve_args)
    try:
        httpx.post(
            url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0},
            timeout=600,
        )
        results = [
            run(url, items, int(c), a.max_tokens, max(1, a.passes) if a.sustained and int(c) > 1 else 0)
            for c in a.clients.split(",")
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    base = results[0]
    if a.sustained:
        each = f"{a.passes} times" if a.passes > 1 else "once"
        shape = (
            f"{len(items)} public-workload prompts; 1 client sends them once, C clients each send all "
            f"of them {each} from their own offset (sustained load)"
        )
    else:
        shape = f"{len(items)} public-workload prompts" + (
            f" ({a.passes} passes over the workload)" if a.passes > 1 else ""
        )
    server = f"llama-server {' '.join(serve_args)}" if a.llama_server else f"serve {' '.join(serve_args)}"
    print(f"{server}; {shape}, greedy, max {a.max_tokens} tokens each; one run\n")
    print(
        "| clients | requests | wall s | generated tok/s | vs 1 client | p50 latency s | p95 latency s | "
        "verify rounds | same text as 1 client |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    alone = {x["index"]: x["text"] for x in base["responses"]}
    for r in results:
        same = sum(x["text"] == alone[x["index"]] for x in r["responses"])
        r["identical"] = same
        print(
            f"| {r['clients']} | {len(r['responses'])} | {r['wall_s']:.1f} | {r['tok_s']:.1f} | "
            f"{r['tok_s'] / base['tok_s']:.2f}x | {r['p50_s']:.1f} | {r['p95_s']:.1f} | {r['draft_rounds']} | "
            f"{same}/{len(r['responses'])} |"
        )
    if any(it.get("kind") in ("edit", "reformat") for it in items):
        print("\nCopy-heavy requests (edit, reformat), median decode tok/s per request (server `timings`):")
        for r in results[:3]:
            speeds = [
                x["timings"].get("predicted_per_second", 0.0)
                for x in r["responses"]
                if x["kind"] in ("edit", "reformat")
            ]
            print(f"- {r['clients']} client(s): {statistics.median(speeds):.1f}")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "serve_args": serve_args,
                    "max_tokens": a.max_tokens,
                    "passes": a.passes,
                    "sustained": a.sustained,
                    "results": results,
                    "startup": lines,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()

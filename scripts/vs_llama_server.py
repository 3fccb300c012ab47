"""`mlxcel serve` against llama.cpp's own `llama-server`, over HTTP, on the same GGUF file.

    python scripts/vs_llama_server.py --llama-server PATH/llama-server [-m FILE.gguf] [--max-tokens 128]
                                      [--rounds 1] [--busy 0] [--threads 2] [--json out.json]

Starts five servers on the same file (default: the default model's Q4_1 GGUF), each with one slot:
ours plainly and with `--draft-kind prompt-lookup` (its defaults), and llama-server plainly, with
`--spec-type ngram-simple` and with `--spec-type ngram-mod` (their defaults). Every prompt of the
public workload goes to each server in turn, as a greedy chat request, so a shared machine's drift
hits all alike; `--rounds N` repeats that (but ngram-mod keeps its n-gram pool across requests,
so from the second round on it drafts a prompt's earlier replies: keep the default of one round
to compare it). Each server's own `timings.predicted_per_second` is the
decode speed (tokens after the first over the time after the first, on both), `timings.prompt_ms`
the prefill (on each server's first sight of the prompt: both cache prompts, so each phase starts
fresh servers). Prints, per kind, the median over prompts of each ratio the decode-step issue
quotes (our plain / its plain, our prompt lookup / its speculation, our prompt lookup / its
plain), the texts that differ, and writes every figure to --json. `--busy N` runs the rounds again
beside N `nice 19` busy loops.

llama-server is built from llama.cpp's source (e.g. the copy inside llama-cpp-python's sdist:
`cmake -S vendor/llama.cpp -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build
--target llama-server`); it is not installed by this project.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import serve_bench  # noqa: E402  (scripts/: the workload file and how a server of ours is started)

from mlxcel_py.bench.busy import busy_loops  # noqa: E402
from mlxcel_py.models import default_model  # noqa: E402


def start_ours(model: str, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    proc, url, _ = serve_bench.start(["-m", model, "-np", "1", "-t", str(threads), *extra])
    return proc, url


def start_llama(binary: str, model: str, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    args = ["-m", model, "-np", "1", "-c", "4096", "-t", str(threads), "-tb", str(threads), *extra]
    proc, url, _ = serve_bench.start_llama_server(binary, args)
    return proc, url


def ask(url: str, prompt: str, max_tokens: int) -> dict:
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0},
        timeout=600,
    )
    r.raise_for_status()
    body = r.json()
    t = body.get("timings", {})
    return {
        "text": body["choices"][0]["message"]["content"],
        "tokens": body["usage"]["completion_tokens"],
        "decode_tps": t.get("predicted_per_second", 0.0),
        "prompt_ms": t.get("prompt_ms", 0.0),
    }


CONFIGS = {
    "ours plain": ("ours", []),
    "ours prompt lookup": ("ours", ["--draft-kind", "prompt-lookup"]),
    "llama.cpp plain": ("llama", []),
    "llama.cpp ngram-simple": ("llama", ["--spec-type", "ngram-simple"]),
    "llama.cpp ngram-mod": ("llama", ["--spec-type", "ngram-mod"]),
}
RATIOS = {
    "our plain / its plain": ("ours plain", "llama.cpp plain"),
    "our lookup / its ngram-simple": ("ours prompt lookup", "llama.cpp ngram-simple"),
    "our lookup / its ngram-mod": ("ours prompt lookup", "llama.cpp ngram-mod"),
    "our lookup / its plain": ("ours prompt lookup", "llama.cpp plain"),
    "its ngram-simple / its plain": ("llama.cpp ngram-simple", "llama.cpp plain"),
    "our lookup / our plain": ("ours prompt lookup", "ours plain"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    model = a.model or str(default_model.default_gguf())
    items = serve_bench.workload()
    results: dict[str, dict] = {}
    for load in [0] + ([a.busy] if a.busy else []):
        label = "busy" if load else "quiet"
        # fresh servers for each phase: both keep prompts cached, and prefill is timed on first sight
        with servers_up(a, model) as servers:
            runs: dict[str, list[list[dict]]] = {name: [[] for _ in items] for name in CONFIGS}
            with busy_loops(load):
                for r in range(a.rounds):
                    for i, it in enumerate(items):
                        for name, (_, url) in servers.items():
                            runs[name][i].append(ask(url, it["prompt"], a.max_tokens))
                        line = " ".join(
                            f"{n.split()[0][0]}{n.split()[-1][:5]}={runs[n][i][-1]['decode_tps']:.0f}" for n in CONFIGS
                        )
                        print(f"{label} round {r + 1} prompt {i} ({it['kind']}): {line}", file=sys.stderr)
        results[label] = summarize(items, runs)
        # every request's figures (the texts only decide the "same text" counts)
        results[label]["runs"] = {
            name: [[{k: v for k, v in x.items() if k != "text"} for x in xs] for xs in per]
            for name, per in runs.items()
        }
        print(f"\n{label} ({a.max_tokens} tokens, {a.rounds} round(s), medians over prompts)\n")
        print(table(results[label]))
    if a.json:
        meta = {"model": model, "max_tokens": a.max_tokens, "rounds": a.rounds, "threads": a.threads}
        Path(a.json).write_text(json.dumps({**meta, "results": results}, indent=2))


@contextmanager
def servers_up(a: argparse.Namespace, model: str) -> Iterator[dict[str, tuple[subprocess.Popen, str]]]:
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name, (who, extra) in CONFIGS.items():
            servers[name] = (
                start_ours(model, a.threads, extra)
                if who == "ours"
                else start_llama(a.llama_server, model, a.threads, extra)
            )
        for _, url in servers.values():  # warm each (first requests pay allocations, thread pools)
            ask(url, "Hello", 8)
        yield servers
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(timeout=30)


def summarize(items: list[dict], runs: dict[str, list[list[dict]]]) -> dict:
    """Per prompt: each config's median decode tok/s and prefill ms; per kind: the median of
    each ratio over its prompts; and which prompts' texts differ between ours and llama.cpp."""
    per_prompt = []
    for i, it in enumerate(items):
        row = {"kind": it["kind"]}
        for name in CONFIGS:
            row[name] = statistics.median(x["decode_tps"] for x in runs[name][i])
            # the first time each server saw the prompt: later rounds reuse its cached prefix
            row[name + " prompt_ms"] = runs[name][i][0]["prompt_ms"]
        row["same text (ours plain = ours lookup)"] = (
            runs["ours plain"][i][0]["text"] == runs["ours prompt lookup"][i][0]["text"]
        )
        row["same text (ours = llama.cpp plain)"] = (
            runs["ours plain"][i][0]["text"] == runs["llama.cpp plain"][i][0]["text"]
        )
        per_prompt.append(row)
    kinds = sorted({r["kind"] for r in per_prompt}) + ["all"]
    by_kind = {}
    for kind in kinds:
        rows = [r for r in per_prompt if kind in ("all", r["kind"])]
        k = {"prompts": len(rows)}
        for label, (num, den) in RATIOS.items():
            k[label] = statistics.median(r[num] / r[den] for r in rows if r[den] > 0)
        for name in CONFIGS:
            k[name] = statistics.median(r[name] for r in rows)
        k["prefill: its / ours"] = statistics.median(
            r["llama.cpp plain prompt_ms"] / r["ours plain prompt_ms"] for r in rows
        )
        by_kind[kind] = k
    return {"per_prompt": per_prompt, "by_kind": by_kind}


def table(res: dict) -> str:
    kinds = list(res["by_kind"])
    out = ["| | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    out.append("| prompts | " + " | ".join(str(res["by_kind"][k]["prompts"]) for k in kinds) + " |")
    for name in CONFIGS:
        out.append(f"| {name}, tok/s | " + " | ".join(f"{res['by_kind'][k][name]:.1f}" for k in kinds) + " |")
    for label in [*RATIOS, "prefill: its / ours"]:
        out.append(f"| {label} | " + " | ".join(f"{res['by_kind'][k][label]:.2f}x" for k in kinds) + " |")
    same = sum(r["same text (ours plain = ours lookup)"] for r in res["per_prompt"])
    same_llama = sum(r["same text (ours = llama.cpp plain)"] for r in res["per_prompt"])
    n = len(res["per_prompt"])
    out.append(
        f"\nour lookup's text equals our plain text: {same}/{n}; our plain text equals llama.cpp's: {same_llama}/{n}"
    )
    return "\n".join(out)


if __name__ == "__main__":
    main()

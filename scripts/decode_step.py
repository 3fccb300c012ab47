"""The plain decode step, side by side with llama.cpp: 1 and 2 threads, quiet and beside busy loops.

    python scripts/decode_step.py [--tokens 128] [--rounds 3] [--busy 1] [-m FILE.gguf] [--context N] [--json out.json]

Greedy plain decoding of the default model (SmolLM2-135M-Instruct, its Q4_1 GGUF), or of `-m`'s
GGUF file (e.g. a bigger shape from scripts/gguf_shape.py), after a short prompt, timed from the first generated token, for mlxcel-py (this checkout's engine: the fused
decoder layers, `MLXCEL_NO_FUSED_LAYERS=1` for mlx-lm's layer code) and llama.cpp
(llama-cpp-python on the same file, `pip install -e '.[llama]'`). Every configuration runs once
per round, interleaved, so a shared machine's drift hits all alike; the median of the rounds is
reported with the ratios that the README quotes (ratios, not absolute speeds: the host is noisy).
"Busy" runs the same rounds with N busy loops at nice 19 beside them (`mlxcel bench --busy`).
`--context N` decodes after a prompt of N tokens instead (the text of docs/cpu.md before the short
prompt): each step then also reads N positions of keys and values a layer. Both programs get the
same token ids.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from mlxcel_py.cpu import blas

blas.prepare()

import mlx.core as mx  # noqa: E402

PROMPT = "Write a short story about a robot learning to paint, in three paragraphs."
FILLER = Path(__file__).resolve().parents[1] / "docs" / "cpu.md"


def greedy_steps(cache, tok: int, n: int) -> list[int]:
    """n greedy one-token steps on `cache` after `tok` (scripts/huge_pages_ab.py and
    memory_scaling.py time the same loop)."""
    out = []
    for _ in range(n):
        tok = int(mx.argmax(cache.feed([tok])[-1]).item())
        out.append(tok)
    return out


def prompt_ids(model, context: int) -> list[int]:
    """The short prompt's ids, after filler text up to `context` ids in all."""
    ids = model.encode(PROMPT)
    if context <= len(ids):
        return ids
    filler = model.encode(FILLER.read_text(), chat_template=False)
    while len(filler) < context:
        filler += filler
    return filler[: context - len(ids)] + ids


def ours(tokens: int, model, ids: list[int]):
    from mlxcel_py.cpu import extension as cpu_extension
    from mlxcel_py.engine.cache import SequenceCache

    qmm, _ = cpu_extension.kernel_status()

    def run(threads: int) -> float:
        if qmm is not None:
            qmm.set_threads(threads)
        cache = SequenceCache(model.model)
        tok = int(mx.argmax(cache.feed(ids)[-1]).item())
        start = time.perf_counter()
        greedy_steps(cache, tok, tokens)
        return tokens / (time.perf_counter() - start)

    return run


def llama(tokens: int, path: str | None, ids: list[int]):
    from llama_cpp import Llama

    from mlxcel_py.models import default_model

    path = path or str(default_model.default_gguf())
    instances = {}
    n_ctx = max(1024, len(ids) + tokens + 64)

    def run(threads: int) -> float:
        if threads not in instances:
            instances[threads] = Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        llm = instances[threads]
        n, start = 0, 0.0
        for _ in llm.generate(ids, temp=0.0, reset=True):
            n += 1
            if n == 1:
                start = time.perf_counter()
            if n > tokens:
                break
        return tokens / (time.perf_counter() - start)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=1, help="busy loops for the loaded half (0: quiet only)")
    ap.add_argument("--ours-only", action="store_true", help="skip llama.cpp (A/B runs of our own builds)")
    ap.add_argument("-m", "--model", default=None, help="a GGUF file (default: the default model's)")
    ap.add_argument("--context", type=int, default=0, help="prompt tokens before decoding (0: the short prompt)")
    ap.add_argument("--json")
    a = ap.parse_args()
    import mlxcel_py as mc
    from mlxcel_py.bench.busy import busy_loops

    model = mc.load(a.model, warmup=False)
    ids = prompt_ids(model, a.context)
    runners = {"mlxcel-py": ours(a.tokens, model, ids)}
    try:
        if not a.ours_only:
            runners["llama.cpp"] = llama(a.tokens, a.model, ids)
    except ImportError:
        print("llama-cpp-python is not installed: ours only (pip install -e '.[llama]')", file=sys.stderr)
    for run in runners.values():  # warm both (first calls pay for allocations and the thread pool)
        run(1), run(2)
    loads = [0] + ([a.busy] if a.busy else [])
    speeds: dict[str, list[float]] = {}
    for load in loads:
        with busy_loops(load):
            for r in range(a.rounds):
                for name, run in runners.items():
                    for threads in (1, 2):
                        key = f"{name} {threads}t {'busy' if load else 'quiet'}"
                        speeds.setdefault(key, []).append(run(threads))
                        print(f"round {r + 1}: {key}: {speeds[key][-1]:.1f} tok/s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in speeds.items()}
    print("| configuration | tok/s (median) |\n|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} |")
    ratios = {}
    for load in ("quiet", "busy") if a.busy else ("quiet",):
        o1, o2 = med[f"mlxcel-py 1t {load}"], med[f"mlxcel-py 2t {load}"]
        ratios[f"ours 2t / 1t ({load})"] = o2 / o1
        if "llama.cpp" in runners:
            best = max(med[f"llama.cpp 1t {load}"], med[f"llama.cpp 2t {load}"])
            ratios[f"ours 2t / llama.cpp best ({load})"] = o2 / best
    if a.busy:
        ratios["ours 2t busy / quiet"] = med["mlxcel-py 2t busy"] / med["mlxcel-py 2t quiet"]
        if "llama.cpp" in runners:
            ratios["llama.cpp 2t busy / quiet"] = med["llama.cpp 2t busy"] / med["llama.cpp 2t quiet"]
    print("\n| ratio | |\n|---|---|")
    for k, v in ratios.items():
        print(f"| {k} | {v:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "tokens": a.tokens,
                    "context": len(ids),
                    "rounds": a.rounds,
                    "busy": a.busy,
                    "speeds": speeds,
                    "ratios": ratios,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()

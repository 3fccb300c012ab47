"""KV cache types side by side: decode and prefill speed at a long context, and quality against f32.

    python scripts/kv_cache_types.py [--context 6000] [--tokens 64] [--rounds 3] [--types f32,f16]
                                     [--quality-tokens 128] [--json out.json]

Speed: greedy plain decoding of the default model after a prompt of `--context` tokens (the text
of docs/cpu.md, as scripts/decode_step.py --context builds it), 2 threads, one model per cache
type (`--cache-type-k/-v`), every type once per round, interleaved, so the host's drift hits all
alike; medians of the rounds and their ratios to f32. Prefill is the same prompt's forward.

With llama-cpp-python installed (`pip install -e '.[llama]'`, it builds llama.cpp), llama.cpp
runs the same token ids on the same GGUF file at its `f16` and `q8_0` caches in the same rounds
(`--llama-types` to change; q8_0 needs its flash attention, which is turned on for every llama.cpp
row so they compare alike).

`-m DIR` runs another model (llama.cpp reads the default GGUF only: pass `--llama-types ''`); a
float copy of the default model (scripts/float_checkpoint.py) runs on the float kernel, whose
activations stay float32, so its quality rows show what the cache type alone changes.

Quality: for each held-out public prompt (mlxcel_py/data/bench_default.jsonl), f32 decodes
`--quality-tokens` greedy tokens; each other type then (a) decodes its own and we count the tokens
until the first difference, and (b) is fed the f32 tokens (teacher forcing) and we count how often
its argmax is f32's next token. Prints Markdown tables (docs/bench/kv-cache-types.md holds a run).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import greedy_steps, prompt_ids  # noqa: E402

WORKLOAD = Path(__file__).resolve().parents[1] / "mlxcel_py" / "data" / "bench_default.jsonl"


def first_token(cache, ids: list[int]) -> int:
    """Prefill in the engine's chunks (64 rows on the kernel path), then the last prompt token."""
    cache.prefill(ids[:-1])
    return int(mx.argmax(cache.feed(ids[-1:])[-1]).item())


def speed(model, ids: list[int], tokens: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of one run on a fresh cache."""
    from mlxcel_py.engine.cache import SequenceCache

    cache = SequenceCache(model.model)
    start = time.perf_counter()
    tok = first_token(cache, ids)
    prefill = len(ids) / (time.perf_counter() - start)
    start = time.perf_counter()
    greedy_steps(cache, tok, tokens)
    return prefill, tokens / (time.perf_counter() - start)


def llama(kv: str, n_ctx: int, logits_all: bool = False):
    """llama.cpp (llama-cpp-python) on the default model's GGUF, cache type `kv`, 2 threads, flash
    attention (its q8_0 cache needs it)."""
    import llama_cpp

    from mlxcel_py.models import default_model

    ggml = {
        "f32": llama_cpp.GGML_TYPE_F32,
        "f16": llama_cpp.GGML_TYPE_F16,
        "q8_0": llama_cpp.GGML_TYPE_Q8_0,
        "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    }[kv]
    return llama_cpp.Llama(
        str(default_model.default_gguf()),
        n_ctx=n_ctx,
        n_threads=2,
        n_threads_batch=2,
        n_batch=512,
        type_k=ggml,
        type_v=ggml,
        flash_attn=True,
        logits_all=logits_all,
        verbose=False,
    )


def llama_runner(ids: list[int], tokens: int, kv: str):
    """(prefill tok/s, decode tok/s) of llama.cpp on the default model's GGUF, cache type `kv`."""
    llm = llama(kv, len(ids) + tokens + 64)

    def run(ids_: list[int], n: int) -> tuple[float, float]:
        # generate() keeps the previous run's matching prefix (the whole prompt, from round 2 on):
        # reset() first so every round prefills the prompt in full, as ours does
        llm.reset()
        count, start, first = 0, time.perf_counter(), 0.0
        for _ in llm.generate(ids_, temp=0.0, reset=True):
            count += 1
            if count == 1:
                first = time.perf_counter()
            if count > n:
                break
        return len(ids_) / (first - start), n / (time.perf_counter() - first)

    return run


def llama_quality(kv_types: list[str], prompts: list[list[int]], n: int) -> dict:
    """llama.cpp measured the way ours is: its own f32 cache's greedy reply to each prompt, then
    each other cache type teacher-forced along that reply, counting where its top-1 agrees."""
    import numpy as np

    def forced(llm, ids: list[int], reply: list[int]) -> list[int]:
        llm.reset()
        llm.eval(ids + reply[:-1])
        rows = np.asarray(llm.scores[len(ids) - 1 : len(ids) + len(reply) - 1])
        return rows.argmax(axis=-1).tolist()

    ref = llama("f32", 2048, logits_all=True)
    replies = []
    for ids in prompts:
        ref.reset()
        reply = []
        for tok in ref.generate(ids, temp=0.0, reset=True):
            reply.append(tok)
            if len(reply) == n:
                break
        replies.append(reply)
    out = {}
    for kv in kv_types:
        llm = llama(kv, 2048, logits_all=True)
        same = total = 0
        for ids, reply in zip(prompts, replies):
            got = forced(llm, ids, reply)
            same += sum(x == y for x, y in zip(got, reply))
            total += len(reply)
        out[f"llama.cpp {kv}"] = same / total
    return out


def greedy(model, ids: list[int], n: int) -> list[int]:
    from mlxcel_py.engine.cache import SequenceCache

    cache = SequenceCache(model.model)
    tok = first_token(cache, ids)
    return [tok] + greedy_steps(cache, tok, n - 1)


def forced_logits(model, ids: list[int], reply: list[int]) -> mx.array:
    """The model's logits after the prompt and after each token of `reply` (teacher forcing)."""
    from mlxcel_py.engine.cache import SequenceCache

    cache = SequenceCache(model.model)
    cache.prefill(ids[:-1])
    rows = [cache.feed(ids[-1:])[-1]]
    for tok in reply[:-1]:
        rows.append(cache.feed([tok])[-1])
    return mx.stack(rows).astype(mx.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="a model folder or .gguf (default: the default model)")
    ap.add_argument("--context", type=int, default=6000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", default="f32,f16")
    ap.add_argument("--quality-tokens", type=int, default=128, help="0: skip the quality half")
    ap.add_argument("--llama-types", default="f16,q8_0", help="llama.cpp's cache types ('': none)")
    ap.add_argument(
        "--llama-quality", action="store_true", help="also llama.cpp's --llama-types against its own f32 cache"
    )
    ap.add_argument("--json")
    a = ap.parse_args()
    import mlxcel_py as mc
    from mlxcel_py.cpu import extension as cpu_extension

    qmm, _ = cpu_extension.kernel_status()
    if qmm is not None:
        qmm.set_threads(2)
    types = a.types.split(",")
    models = {t: mc.load(a.model, cache_type_k=t, cache_type_v=t, warmup=False) for t in types}
    ids = prompt_ids(models[types[0]], a.context)
    runners = {t: (lambda ids_, n, m=models[t]: speed(m, ids_, n)) for t in types}
    try:
        for t in filter(None, a.llama_types.split(",")):
            runners[f"llama.cpp {t}"] = llama_runner(ids, a.tokens, t)
    except ImportError:
        print("llama-cpp-python is not installed: ours only (pip install -e '.[llama]')", file=sys.stderr)
    for run in runners.values():  # warm each (first calls pay for allocations and the thread pool)
        run(ids[:256], 8)
    prefill: dict[str, list[float]] = {t: [] for t in runners}
    decode: dict[str, list[float]] = {t: [] for t in runners}
    for r in range(a.rounds):
        for t, run in runners.items():
            p, d = run(ids, a.tokens)
            prefill[t].append(p)
            decode[t].append(d)
            print(f"round {r + 1}: {t}: prefill {p:.0f} tok/s, decode {d:.1f} tok/s", file=sys.stderr)
    base = types[0]
    print(f"\n{len(ids)}-token prompt, {a.tokens} greedy tokens, 2 threads, median of {a.rounds} rounds\n")
    print(
        f"| cache type | bytes a token | decode tok/s | vs {base} | prefill tok/s | vs {base} |\n|---|---|---|---|---|---|"
    )
    med_d = {t: statistics.median(decode[t]) for t in runners}
    med_p = {t: statistics.median(prefill[t]) for t in runners}
    for t in runners:
        size = f"{models[t].session.target.kv_bytes_per_token:,}" if t in models else ""
        print(
            f"| {t} | {size} | {med_d[t]:.1f} | {med_d[t] / med_d[base]:.2f}x "
            f"| {med_p[t]:.0f} | {med_p[t] / med_p[base]:.2f}x |"
        )
    quality = {}
    if a.quality_tokens:
        prompts = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
        ref = models[base]
        for t in types[1:]:
            same, total, first, gaps, all_gaps = 0, 0, [], [], []
            for p in prompts:
                pids = ref.encode(p["prompt"])
                want = greedy(ref, pids, a.quality_tokens)
                got = greedy(models[t], pids, a.quality_tokens)
                first.append(next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), len(want)))
                ref_rows = forced_logits(ref, pids, want)
                forced = mx.argmax(forced_logits(models[t], pids, want), axis=-1).tolist()
                top2 = mx.sort(ref_rows, axis=-1)[:, -2:]
                all_gaps += (top2[:, 1] - top2[:, 0]).tolist()
                for i, (x, y) in enumerate(zip(forced, want)):
                    same += x == y
                    if x != y:  # how close f32 itself was to the other choice
                        gaps.append((ref_rows[i, y] - ref_rows[i, x]).item())
                total += len(want)
            quality[t] = {
                "top1_agreement": same / total,
                "first_difference": first,
                "disagreement_gaps": gaps,
                "median_top2_gap": statistics.median(all_gaps),
            }
        print(
            f"\n| cache type | teacher-forced top-1 agreement with {base} | greedy tokens until the first difference "
            f"| {base}'s logit gap where they differ (median; all positions' top-2 gap) |"
        )
        print("|---|---|---|---|")
        for t, q in quality.items():
            gap = statistics.median(q["disagreement_gaps"]) if q["disagreement_gaps"] else 0.0
            print(
                f"| {t} | {q['top1_agreement']:.2%} | {', '.join(map(str, q['first_difference']))} (of {a.quality_tokens}) "
                f"| {gap:.3f} ({q['median_top2_gap']:.3f}) |"
            )
        if a.llama_quality:
            kinds = [t for t in filter(None, a.llama_types.split(",")) if t != "f32"]
            theirs = llama_quality(kinds, [ref.encode(p["prompt"]) for p in prompts], a.quality_tokens)
            for t, agreement in theirs.items():
                quality[t] = {"top1_agreement": agreement, "against": "llama.cpp f32"}
                print(f"| {t} (against llama.cpp's f32) | {agreement:.2%} | | |")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"context": len(ids), "tokens": a.tokens, "prefill": prefill, "decode": decode, "quality": quality},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()

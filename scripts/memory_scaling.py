"""How far a second thread can speed up a step that streams its weights: the memory system's own
scaling, beside the decode step's, at 1 and 2 threads.

    python scripts/memory_scaling.py [-m FILE.gguf] [--rounds 5] [--tokens 128] [--json out.json]

Plain decoding reads every weight once a token, so on a CPU whose memory bandwidth does not grow
with the cores a second thread cannot make the step much faster, however well the threads share
the work. This measures both, interleaved round by round (the host drifts 20-30% within a run):

- stream: a read-only pass over a buffer larger than the L3 cache (the default model's 92 MiB
  of kernel weights, and 512 MiB), AVX2 loads, by 1 thread and by 2 threads each reading its half
  (a small C++ program compiled here with the system's c++; no compiler, no stream rows);
- the decode step (greedy, one row), split by the kernel's own counters into the fused decoder
  layers, the output projection (one 28 MB matmul on the default model: a single long stream,
  no barrier inside) and the rest (Python graph building, MLX's scheduling, sampling).

Prints a Markdown table of the medians and the 2-thread / 1-thread ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STREAM = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <sys/mman.h>
// argv: MiB threads reps -> GB/s of a read-only pass, each thread over its own slice
int main(int argc, char** argv) {
  const size_t n = static_cast<size_t>(atoi(argv[1])) << 20;
  const int threads = atoi(argv[2]), reps = atoi(argv[3]);
  char* buf = static_cast<char*>(aligned_alloc(2 << 20, n));
  madvise(buf, n, MADV_HUGEPAGE);
  memset(buf, 1, n);
  std::vector<long long> sink(threads);
  auto pass = [&] {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t a = n / threads * t, b = n / threads * (t + 1);
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        for (size_t i = a; i < b; i += 64) {
          s0 = _mm256_xor_si256(s0, _mm256_load_si256(reinterpret_cast<const __m256i*>(buf + i)));
          s1 = _mm256_xor_si256(s1, _mm256_load_si256(reinterpret_cast<const __m256i*>(buf + i + 32)));
        }
        sink[t] += _mm256_extract_epi64(_mm256_xor_si256(s0, s1), 0);
      });
    for (auto& t : ts) t.join();
  };
  pass();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) pass();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("%.3f %lld\n", n * static_cast<double>(reps) / s / 1e9, sink[0] & 1);
}
"""


def stream_binary(tmp: Path) -> Path | None:
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return None
    src, exe = tmp / "stream.cpp", tmp / "stream"
    src.write_text(STREAM)
    subprocess.run([cxx, "-O2", "-mavx2", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


def stream(exe: Path, mib: int, threads: int) -> float:
    out = subprocess.run([str(exe), str(mib), str(threads), "10"], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json")
    a = ap.parse_args()

    from mlxcel_py.cpu import blas

    blas.prepare()
    import mlx.core as mx
    from decode_step import PROMPT, greedy_steps  # this folder: the same prompt and step loop

    import mlxcel_py as mc
    from mlxcel_py.cpu import extension as cpu_extension
    from mlxcel_py.engine.cache import SequenceCache

    model = mc.load(a.model, warmup=False)
    qmm, why = cpu_extension.kernel_status()
    if qmm is None:
        sys.exit(f"the row-exact kernel is not in use: {why}")
    ids = model.encode(PROMPT)

    def step(threads: int) -> dict[str, float]:
        qmm.set_threads(threads)
        cache = SequenceCache(model.model)
        tok = int(mx.argmax(cache.feed(ids)[-1]).item())
        (k0, _), (l0, _) = qmm.kernel_time(), qmm.layer_time()
        t0 = time.perf_counter()
        greedy_steps(cache, tok, a.tokens)
        total = (time.perf_counter() - t0) / a.tokens
        (k1, _), (l1, _) = qmm.kernel_time(), qmm.layer_time()
        layers, head = (l1 - l0) / a.tokens, (k1 - k0) / a.tokens
        return {"step": total * 1e3, "layers": layers * 1e3, "head": head * 1e3, "rest": (total - layers - head) * 1e3}

    got: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        exe = stream_binary(Path(tmp))
        for _ in range(a.rounds):
            for threads in (1, 2):
                if exe is not None:
                    for mib in (92, 512):
                        got.setdefault(f"stream {mib} MiB GB/s {threads}t", []).append(stream(exe, mib, threads))
                for part, ms in step(threads).items():
                    got.setdefault(f"{part} ms {threads}t", []).append(ms)
    med = {k: statistics.median(v) for k, v in got.items()}
    rows = []
    for name in ("stream 92 MiB GB/s", "stream 512 MiB GB/s"):
        if f"{name} 1t" in med:
            rows.append(
                (
                    name.replace(" GB/s", " (GB/s)"),
                    med[f"{name} 1t"],
                    med[f"{name} 2t"],
                    med[f"{name} 2t"] / med[f"{name} 1t"],
                )
            )
    for part, label in (
        ("step", "decode step"),
        ("layers", "fused layers"),
        ("head", "output projection"),
        ("rest", "the rest"),
    ):
        one, two = med[f"{part} ms 1t"], med[f"{part} ms 2t"]
        rows.append((f"{label} (ms)", one, two, one / two))
    print("| | 1 thread | 2 threads | 2 threads / 1 thread (speed) |")
    print("|---|---|---|---|")
    for name, one, two, ratio in rows:
        print(f"| {name} | {one:.2f} | {two:.2f} | {ratio:.2f}x |")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "runs": got, "medians": med}, indent=1) + "\n")


if __name__ == "__main__":
    main()

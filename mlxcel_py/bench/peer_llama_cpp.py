"""llama.cpp in its own process, for `mlxcel bench --vs llama.cpp` (llama-cpp-python, optional).

Run as `python -m mlxcel_py.bench.peer_llama_cpp MODEL.gguf`. Same protocol as peer_mlx_lm.py: one JSON
request per line on stdin ({"ids", "max_tokens", "num_draft"?, sampling...}), one JSON answer per
line on the original stdout. `num_draft` runs llama-cpp-python's prompt-lookup decoding
(`LlamaPromptLookupDecoding`, llama.cpp's n-gram lookup) at that width, else plain decoding. Decode
tok/s counts the tokens after the first over the time after the first, as ours and mlx-lm's do
(the first token ends the prompt's prefill). It runs on the same GGUF file, its own SIMD kernels.

`MLXCEL_LLAMA_NO_REPACK=1` turns off llama.cpp's weight repacking (its "extra buffer types"): a
llama.cpp built with `-march=native` on a CPU that advertises AMX to a guest that may not use it
crashes in the AMX repack path; building with `-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF` avoids that
without giving up the AVX2/AVX-512 repacks.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # llama.cpp logs from C; keep them off the protocol stream
    sys.stdout = sys.stderr

    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    if os.environ.get("MLXCEL_LLAMA_NO_REPACK") == "1":
        defaults = llama_cpp.llama_model_default_params

        def params():
            p = defaults()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_cpp.llama_model_default_params = params
    threads = int(os.environ.get("MLXCEL_LLAMA_THREADS", "0")) or os.cpu_count() or 1
    ngram = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ctx = int(os.environ.get("MLXCEL_LLAMA_CTX", "4096"))
    instances: dict[bool, object] = {}

    def instance(lookup: bool):
        # llama-cpp-python's draft verification reads every position's logits (logits_all); plain
        # decoding gets an instance without that, as a llama.cpp user would run it
        if lookup not in instances:
            instances[lookup] = llama_cpp.Llama(
                sys.argv[1], n_ctx=ctx, n_threads=threads, n_batch=512, logits_all=lookup, verbose=False
            )
        return instances[lookup]

    instance(False)
    proto.write(json.dumps({"ready": True, "threads": threads}) + "\n")
    proto.flush()
    for line in sys.stdin:
        req = json.loads(line)
        width = req.get("num_draft")
        llm = instance(bool(width))
        llm.draft_model = LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=width) if width else None
        llm.reset()  # no prefix reuse across requests: every run pays its own prefill, as ours do
        eos = llm.token_eos()
        n, first, last = 0, 0.0, 0.0
        start = time.perf_counter()
        for tok in llm.generate(
            req["ids"],
            temp=req.get("temp", 0.0),
            top_p=req.get("top_p", 1.0),
            top_k=req.get("top_k", 0),
            min_p=req.get("min_p", 0.0),
            repeat_penalty=1.0,
            reset=True,
        ):
            now = time.perf_counter()
            if tok == eos:
                break
            n += 1
            first = first or now
            last = now
            if n >= req["max_tokens"]:
                break
        tps = (n - 1) / (last - first) if n > 1 and last > first else 0.0
        # prefill: the call's start to the first token (its prompt pass and one sampling step)
        prefill = first - start if first else 0.0
        proto.write(json.dumps({"tokens": n, "tps": tps, "peak_mib": 0.0, "prefill_s": prefill}) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()

"""Cross-check the GGUF importer against llama.cpp itself (needs `pip install llama-cpp-python`).

For every architecture the tests write (tests/gguf_files.py, llama.cpp's converter conventions),
write a float32 GGUF of a tiny random model, then compare llama.cpp's logits and greedy tokens with
ours on the imported folder. This checks the layout quirks (Q/K permutation, Gemma's norm offset
and query scale, fused Phi-3 projections, MoE routing) against the program that defines them,
which the unit tests cannot do. Random weights: it proves the mapping, not model quality.

    .venv/bin/python scripts/check_gguf_vs_llama_cpp.py [--decoded] [family ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from mlxcel_py.cpu import blas  # noqa: E402

blas.prepare()

import gguf_files  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlxcel_py.models import loading  # noqa: E402
from mlxcel_py.models.gguf import convert as importer  # noqa: E402

PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 120, 64, 9, 33]
STEPS = 16


def ours(folder: Path) -> tuple[np.ndarray, list[int]]:
    lm = loading.load(loading.resolve(str(folder)))
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(lm.model)
    logits = lm.model(mx.array([PROMPT]), cache=cache)[0, -1].astype(mx.float32)
    first = np.array(logits)
    toks = []
    for _ in range(STEPS):
        t = int(mx.argmax(logits).item())
        toks.append(t)
        logits = lm.model(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)
    return first, toks


def theirs(path: Path) -> tuple[np.ndarray, list[int]]:
    import llama_cpp

    default_params = llama_cpp.llama_model_default_params

    def params():  # no weight repacking: llama.cpp's AMX repack crashes on CPUs that hide AMX from guests
        p = default_params()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_cpp.llama_model_default_params = params
    llm = llama_cpp.Llama(str(path), n_ctx=128, n_threads=2, logits_all=True, verbose=False)
    llm.eval(PROMPT)
    first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    toks = []
    for _ in range(STEPS):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        toks.append(t)
        llm.eval([t])
    return first, toks


def main(families: list[str], kinds: list) -> int:
    exact = kinds == [gguf_files.Q.F32]  # llama.cpp quantizes activations (q8) for quantized weights
    bad = 0
    for family in families:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{family}.gguf"
            gguf_files.write(path, family, kinds)
            folder = importer.convert(path, Path(tmp) / "converted")
            try:
                a_logits, a = ours(folder)
                b_logits, b = theirs(path)
            except Exception as exc:  # llama.cpp refuses some tiny shapes; say so and go on
                print(f"{family:9s} not compared: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            diff = float(np.abs(a_logits - b_logits).max())
            scale = float(np.abs(b_logits).max())
            same = a == b
            # llama.cpp keeps its KV cache in f16; with quantized weights it also quantizes activations
            bad += (not same and exact) or diff > (5e-3 if exact else 5e-2) * max(1.0, scale)
            print(
                f"{family:9s} greedy {'equal' if same else 'DIFFER'} ({STEPS} tokens); "
                f"first-step logits max |diff| {diff:.2e} (max |logit| {scale:.2f})"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    kinds = [gguf_files.Q.F32]
    if args[:1] == ["--decoded"]:  # K-quants, i-quants and the rest: llama.cpp quantizes activations for these
        args, kinds = args[1:], [q for q in gguf_files.DECODED if q not in (gguf_files.Q.BF16,)]
    sys.exit(main(args or list(gguf_files.CONFIGS), kinds))

"""A GGUF LoRA adapter applied by llama.cpp and by us, on the default model (needs llama-cpp-python).

Writes a random LoRA adapter for the default model's GGUF in llama.cpp's layout (the layout
tests/gguf_files.write_lora writes: lora_a [rank, in], lora_b [out, rank] with Q/K rows in the
rotary order, alpha), then compares greedy tokens after each prompt: llama.cpp with the adapter
(`lora_path`, applied unfused in float) against us with it (`--lora`, fused), the fused layers
stored at 8 bits (adapters.fused_bits, the default) and at their own 4 bits. The base model's
agreement with llama.cpp is the bar: the adapter should cost none of it. Random weights in the
adapter, a real model under it: it checks the file's reading and the fusing's precision, not an
adapter's quality.

    .venv/bin/python scripts/lora_vs_llama_cpp.py [--std 0.05] [--rank 8] [--tokens 48] [--prompts 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import gguf  # noqa: E402
import numpy as np  # noqa: E402

import mlxcel_py  # noqa: E402
from mlxcel_py.models import adapters  # noqa: E402
from mlxcel_py.models.default_model import default_gguf  # noqa: E402
from mlxcel_py.models.gguf import convert  # noqa: E402

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _permute(b: np.ndarray, heads: int) -> np.ndarray:
    return b.reshape(heads, 2, b.shape[0] // heads // 2, *b.shape[1:]).swapaxes(1, 2).reshape(b.shape)


def write_adapter(base: Path, out: Path, rank: int, std: float, seed: int = 0) -> Path:
    """A random LoRA on every projection of every layer, as convert_lora_to_gguf.py lays one out."""
    md = convert.metadata(convert.read(base))
    heads, kv = int(md["llama.attention.head_count"]), int(md["llama.attention.head_count_kv"])
    h, ff, layers = (
        int(md["llama.embedding_length"]),
        int(md["llama.feed_forward_length"]),
        int(md["llama.block_count"]),
    )
    d = h // heads
    shapes = {  # (out, in)
        "attn_q": (heads * d, h),
        "attn_k": (kv * d, h),
        "attn_v": (kv * d, h),
        "attn_output": (h, heads * d),
        "ffn_gate": (ff, h),
        "ffn_up": (ff, h),
        "ffn_down": (h, ff),
    }
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(2 * rank))
    for i in range(layers):
        for name in PROJECTIONS:
            o, n = shapes[name]
            a = rng.normal(0, std, (rank, n)).astype(np.float32)
            b = rng.normal(0, std, (o, rank)).astype(np.float32)
            if name in ("attn_q", "attn_k"):
                b = _permute(b, heads if name == "attn_q" else kv)
            w.add_tensor(f"blk.{i}.{name}.weight.lora_a", a)
            w.add_tensor(f"blk.{i}.{name}.weight.lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def theirs(base: Path, adapter: Path | None, prompts: list[str], n: int) -> list[list[int]]:
    from llama_cpp import Llama

    extra = {"lora_path": str(adapter)} if adapter else {}
    llm = Llama(model_path=str(base), n_ctx=2048, n_threads=2, verbose=False, seed=0, **extra)
    out = []
    for p in prompts:
        llm.reset()
        ids = []
        for t in llm.generate(llm.tokenize(p.encode(), add_bos=True), temp=0.0, top_k=1):
            if t == llm.token_eos() or len(ids) >= n:
                break
            ids.append(t)
        out.append(ids)
    return out


def ours(base: Path, adapter: Path | None, prompts: list[str], n: int) -> list[list[int]]:
    model = mlxcel_py.load(str(base), adapters=[(str(adapter), 1.0)] if adapter else ())
    out = []
    for p in prompts:
        ids = [t for piece in mlxcel_py.stream(model, p, max_tokens=n, chat_template=False) for t in piece.tokens]
        out.append(ids[:n])
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, int]:
    """Mean tokens before the first difference, and how many replies are identical."""
    firsts = []
    for x, y in zip(a, b):
        k = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        firsts.append(k)
    return float(np.mean(firsts)), sum(x == y for x, y in zip(a, b))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--std", type=float, default=0.05)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=6)
    args = ap.parse_args()
    base = Path(default_gguf())
    lines = (ROOT / "benchmarks" / "workloads.jsonl").read_text().splitlines()
    prompts = [json.loads(x)["prompt"] for x in lines[: args.prompts]]
    with tempfile.TemporaryDirectory() as tmp:
        adapter = write_adapter(base, Path(tmp) / "lora.gguf", args.rank, args.std)
        ref_base = theirs(base, None, prompts, args.tokens)
        ref = theirs(base, adapter, prompts, args.tokens)
        rows = [("base model, no adapter", agreement(ours(base, None, prompts, args.tokens), ref_base))]
        rows.append(
            ("adapter, fused layers at 8 bits (default)", agreement(ours(base, adapter, prompts, args.tokens), ref))
        )
        own_bits = adapters.fused_bits
        adapters.fused_bits = lambda layer: layer.bits  # what mlx_lm.fuse does by default
        try:
            rows.append(
                ("adapter, fused layers at their own 4 bits", agreement(ours(base, adapter, prompts, args.tokens), ref))
            )
        finally:
            adapters.fused_bits = own_bits
        changed = sum(x != y for x, y in zip(ref, ref_base))
    print(
        f"{len(prompts)} prompts of benchmarks/workloads.jsonl, {args.tokens} greedy tokens; random LoRA rank "
        f"{args.rank}, std {args.std}, on every projection; llama.cpp's text changed on {changed} of them\n"
    )
    print("| ours vs llama.cpp | tokens before the first difference (mean) | identical replies |")
    print("|---|---|---|")
    for name, (first, same) in rows:
        print(f"| {name} | {first:.1f} of {args.tokens} | {same} of {len(prompts)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

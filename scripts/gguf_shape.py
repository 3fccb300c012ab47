"""Write a random-weight GGUF of a llama shape with the default model's tokenizer: a bigger model
than SmolLM2 to benchmark against llama.cpp on the same file (decode is bandwidth-bound there).

    python scripts/gguf_shape.py OUT.gguf [--type Q4_0] [--hidden 2048 --layers 16 --ffn 8192
                                           --heads 32 --kv-heads 8]
    mlxcel bench -m OUT.gguf --vs llama.cpp ...

The default shape is Llama-3.2-1B's (hidden 2048, 16 layers, FFN 8192, 32 query and 8 KV heads of
64), with SmolLM2's 49,152-token vocabulary and tied embeddings. Weights are random blocks of the
chosen type (random quantized values, one scale a tensor), so the text is noise: this measures
speed, not output. Types: Q4_0, Q4_1, Q8_0 (what MLX reads itself) or F16.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

from mlxcel_py.models.default_model import default_gguf

TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)


def random_tensor(qtype: gguf.GGMLQuantizationType, rows: int, cols: int, rng) -> np.ndarray:
    """rows x cols of `qtype` with random values and a scale that keeps activations moderate."""
    if qtype == gguf.GGMLQuantizationType.F16:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.02 / 8).tobytes(), np.uint8)
    raw[:, :, 0:2] = d  # the block scale (d) leads every one of these types
    if qtype == gguf.GGMLQuantizationType.Q4_1:
        raw[:, :, 2:4] = np.frombuffer(np.float16(-0.02).tobytes(), np.uint8)  # its minimum (m)
    return raw.reshape(rows, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default="Q4_0", choices=("Q4_0", "Q4_1", "Q8_0", "F16"))
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    qtype = gguf.GGMLQuantizationType[a.type]
    src = gguf.GGUFReader(str(default_gguf()))
    tokens = src.fields["tokenizer.ggml.tokens"].contents()
    head_dim = a.hidden // a.heads
    w = gguf.GGUFWriter(str(a.out), "llama")
    w.add_name(f"random llama {a.hidden}x{a.layers} {a.type}")
    w.add_block_count(a.layers)
    w.add_context_length(8192)
    w.add_embedding_length(a.hidden)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(len(tokens))
    for key in TOKENIZER_KEYS:  # the default model's tokenizer, as its file has it
        field = src.fields.get(key)
        if field is None:
            continue
        value, kind = field.contents(), field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, kind)
    rng = np.random.default_rng(a.seed)
    kv = a.kv_heads * head_dim
    shapes = {"token_embd.weight": (len(tokens), a.hidden)}
    for i in range(a.layers):
        b = f"blk.{i}."
        shapes |= {
            b + "attn_q.weight": (a.hidden, a.hidden),
            b + "attn_k.weight": (kv, a.hidden),
            b + "attn_v.weight": (kv, a.hidden),
            b + "attn_output.weight": (a.hidden, a.hidden),
            b + "ffn_gate.weight": (a.ffn, a.hidden),
            b + "ffn_up.weight": (a.ffn, a.hidden),
            b + "ffn_down.weight": (a.hidden, a.ffn),
        }
    for name, (rows, cols) in shapes.items():
        data = random_tensor(qtype, rows, cols, rng)
        w.add_tensor(name, data, raw_dtype=None if qtype == gguf.GGMLQuantizationType.F16 else qtype)
    for i in range(a.layers):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(a.hidden, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(a.hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {a.out.stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()

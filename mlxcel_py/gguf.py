"""GGUF import: turn a llama-architecture GGUF file into an mlx-lm model folder.

`mx.load` already reads GGUF tensors (Q4_0/Q4_1/Q8_0 come back as MLX affine-quantized triples,
group 32; F16/F32 as plain arrays). What it leaves to us: mlx-lm names, undoing llama.cpp's Q/K
row permutation, a `config.json` (with per-module bit widths), and a tokenizer + chat template
rebuilt from the metadata. The folder is written once and then loaded like any mlx-lm model,
so stock mlx-lm can load it too (benchmarks compare like with like).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .errors import ModelError

SUPPORTED_ARCHITECTURES = ("llama",)
GROUP_SIZE = 32  # every GGUF block quant MLX reads has 32 values per block

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _scalar(md: dict, key: str, default=None):
    if key not in md:
        if default is None:
            raise ModelError(f"GGUF metadata has no '{key}'; the file is not a complete llama model")
        return default
    value = md[key]
    return value.item() if hasattr(value, "item") else value


def _mlx_name(gguf_name: str) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")  # suffix: weight | scales | biases | bias
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return None


def _unpermute(x, n_heads: int):
    """Undo llama.cpp's rotary row permutation on axis 0 (rows are output features).

    View the R rows as (heads, 2, R/heads/2) as the converter wrote them, i.e. read its layout
    (heads, R/heads/2, 2) back by swapping the last two of those axes.
    """
    rows = x.shape[0]
    rest = x.shape[1:]
    y = x.reshape(n_heads, rows // n_heads // 2, 2, *rest)
    return y.swapaxes(1, 2).reshape(rows, *rest)


def _tokenizer_json(md: dict) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import AddedToken

    model_kind = _scalar(md, "tokenizer.ggml.model", "")
    if model_kind != "gpt2":
        raise ModelError(
            f"GGUF tokenizer model '{model_kind}' is not supported (only byte-level BPE, 'gpt2')"
        )
    tokens = list(md["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if _scalar(md, "tokenizer.ggml.pre", "") in ("smollm", "starcoder", "refact", "qwen2"):
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    types = md.get("tokenizer.ggml.token_type")
    if types is not None:
        special = [tokens[i] for i, t in enumerate(types.tolist()) if t == 3]
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    return tok.to_str()


def convert(gguf_path: Path, out_dir: Path) -> Path:
    """Write an mlx-lm folder for `gguf_path` into `out_dir` (atomically) and return it."""
    import mlx.core as mx

    try:
        weights, md = mx.load(str(gguf_path), return_metadata=True)
    except Exception as exc:  # mlx raises ValueError/RuntimeError with its own text
        raise ModelError(f"{gguf_path}: cannot read as GGUF ({exc})") from None
    arch = _scalar(md, "general.architecture", "unknown")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"{gguf_path}: GGUF architecture '{arch}' is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    n_heads = int(_scalar(md, f"{arch}.attention.head_count"))
    n_kv = int(_scalar(md, f"{arch}.attention.head_count_kv", n_heads))
    tokens = md.get("tokenizer.ggml.tokens") or []
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": int(_scalar(md, f"{arch}.embedding_length")),
        "num_hidden_layers": int(_scalar(md, f"{arch}.block_count")),
        "intermediate_size": int(_scalar(md, f"{arch}.feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "rms_norm_eps": float(_scalar(md, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_scalar(md, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_scalar(md, f"{arch}.context_length", 2048)),
        "vocab_size": int(_scalar(md, f"{arch}.vocab_size", len(tokens))),
        "tie_word_embeddings": "output.weight" not in weights,
        "bos_token_id": int(_scalar(md, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(_scalar(md, "tokenizer.ggml.eos_token_id", 2)),
    }
    out: dict = {}
    quant: dict = {"group_size": GROUP_SIZE, "bits": 4}
    for name, value in weights.items():
        mlx_name = _mlx_name(name)
        if mlx_name is None:
            continue  # e.g. rope_freqs: recomputed by mlx-lm from rope_theta
        if ".self_attn.q_proj." in mlx_name:
            value = _unpermute(value, n_heads)
        elif ".self_attn.k_proj." in mlx_name:
            value = _unpermute(value, n_kv)
        out[mlx_name] = value
        if mlx_name.endswith(".scales"):
            module = mlx_name[: -len(".scales")]
            packed = weights[name[: -len(".scales")] + ".weight"]
            in_features = value.shape[-1] * GROUP_SIZE
            bits = packed.shape[-1] * 32 // in_features
            quant[module] = {"group_size": GROUP_SIZE, "bits": int(bits)}
    module_bits = [v["bits"] for k, v in quant.items() if isinstance(v, dict)]
    if module_bits:
        common = max(set(module_bits), key=module_bits.count)
        quant["bits"] = common
        quant = {k: v for k, v in quant.items() if not (isinstance(v, dict) and v["bits"] == common)}
        config["quantization"] = quant
        config["quantization_config"] = quant
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / "model.safetensors"), out, metadata={"format": "mlx"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (tmp / "tokenizer.json").write_text(_tokenizer_json(md))
    eos = tokens[config["eos_token_id"]] if tokens else "<|endoftext|>"
    bos = tokens[config["bos_token_id"]] if tokens else None
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "bos_token": bos,
        "pad_token": eos,
        "add_bos_token": bool(_scalar(md, "tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    if "tokenizer.chat_template" in md:
        tok_config["chat_template"] = str(md["tokenizer.chat_template"])
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    (tmp / "SOURCE").write_text(f"converted from {gguf_path}\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.replace(out_dir)
    return out_dir


def converted_dir(gguf_path: Path, cache_root: Path) -> Path:
    """Where the conversion of this file lives: keyed by name, size and mtime."""
    st = gguf_path.stat()
    key = f"{gguf_path.stem}-{st.st_size}-{int(st.st_mtime)}"
    return cache_root / "gguf" / key


def ensure_converted(gguf_path: Path, cache_root: Path) -> Path:
    out = converted_dir(gguf_path, cache_root)
    if not (out / "config.json").exists():
        convert(gguf_path, out)
    return out

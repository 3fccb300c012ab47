"""`/v1/models`' `meta` block, llama-server's: vocabulary type and size, context windows,
embedding width, parameter count and weight bytes, read once at startup from the checkpoint's
config, tokenizer.json and safetensors headers (no tensor data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..models.safetensors import parameter_count

# llama.cpp's enum llama_vocab_type, by what tokenizer.json calls the model
SPM, BPE, WPM, UGM = 1, 2, 3, 4
# and by a GGUF's `tokenizer.ggml.model`, which is what llama.cpp itself reads (llama-vocab.cpp)
GGUF_VOCAB_TYPES = {"no_vocab": 0, "llama": SPM, "gpt2": BPE, "bert": WPM, "t5": UGM, "rwkv": 5, "plamo2": 6}


def vocab_type(folder: Path, gguf: Path | None = None) -> int:
    """llama.cpp's number for the tokenizer's kind: a GGUF file's own `tokenizer.ggml.model` where
    the model came from one (what llama-server reports for it); else from tokenizer.json: a
    byte-fallback BPE is SentencePiece's (1), a byte-level one GPT-2's (2), WordPiece 3, Unigram 4;
    0 where neither says."""
    if gguf is not None:
        from ..models.gguf import convert

        try:
            field = convert.read(gguf).fields.get("tokenizer.ggml.model")
            kind = field.contents() if field is not None else None
        except Exception:  # an unreadable file was refused at load; the folder still answers
            kind = None
        if isinstance(kind, str):
            return GGUF_VOCAB_TYPES.get(kind, 0)
    try:
        model = json.loads((folder / "tokenizer.json").read_text()).get("model") or {}
    except (OSError, ValueError):
        return 0
    kind = model.get("type")
    if kind == "BPE":
        return SPM if model.get("byte_fallback") else BPE
    return {"WordPiece": WPM, "Unigram": UGM}.get(kind, 0)


def model_meta(resolved: Any, n_vocab: int, n_ctx: int, n_ctx_train: int) -> dict:
    """The block for the model `resolved` (models.loading.ResolvedModel) as this server runs it."""
    cfg = resolved.config
    weights = [resolved.gguf] if resolved.gguf is not None else sorted(resolved.path.glob("*.safetensors"))
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    return {
        "vocab_type": vocab_type(resolved.path, resolved.gguf),
        "n_vocab": n_vocab,
        "n_ctx": n_ctx,
        "n_ctx_train": n_ctx_train,
        "n_embd": text.get("hidden_size") or text.get("n_embd") or text.get("d_model") or 0,
        "n_params": parameter_count(resolved.path, cfg),
        "size": sum(f.stat().st_size for f in weights if f.is_file()),
    }

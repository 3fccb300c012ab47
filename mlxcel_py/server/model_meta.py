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


def vocab_type(folder: Path) -> int:
    """llama.cpp's number for the tokenizer's kind: a byte-fallback BPE is SentencePiece's (1),
    a byte-level one GPT-2's (2), WordPiece 3, Unigram 4; 0 where tokenizer.json is missing."""
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
        "vocab_type": vocab_type(resolved.path),
        "n_vocab": n_vocab,
        "n_ctx": n_ctx,
        "n_ctx_train": n_ctx_train,
        "n_embd": text.get("hidden_size") or text.get("n_embd") or text.get("d_model") or 0,
        "n_params": parameter_count(resolved.path, cfg),
        "size": sum(f.stat().st_size for f in weights if f.is_file()),
    }

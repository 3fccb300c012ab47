"""A model folder's config.json: read once, checked, and flattened where a wrapper nests it."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelError
from ..inputs.files import MIB, UnreadableFile, read_text

CONFIG_LIMIT = 16 * MIB  # bytes of a config.json (the largest real ones are tens of KiB)

# a model's sizes, checked before anything is built from them: each a whole number in this range
# (num_hidden_layers 10**9 grew to 6 GB before anything was said; 0 or -1 ended in mlx-lm's
# "'full_attention' is not in list", "many" in a traceback)
SIZE_RANGES = {
    "num_hidden_layers": (1, 4096),
    "hidden_size": (1, 1 << 17),
    "intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "head_dim": (1, 1 << 14),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 31),
}


def read_config(folder: Path, *, what: str = "--model") -> dict:
    """Parse and sanity-check `folder/config.json`; the errors name the file and the fix."""
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelError(
            f"{what} {folder}: no config.json in this folder, so it is not an mlx-lm model folder",
            hint="pass a folder made by mlx_lm.convert, a .gguf file, or an owner/name repo id",
        )
    try:
        cfg = json.loads(read_text(cfg_path, CONFIG_LIMIT))
    except UnreadableFile as exc:
        raise ModelError(f"{what} {cfg_path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{what} {cfg_path}: malformed JSON ({exc})") from None
    except RecursionError:
        raise ModelError(f"{what} {cfg_path}: malformed JSON (nested too deeply)") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{what} {cfg_path}: expected a JSON object, got {type(cfg).__name__}")
    if "model_type" not in cfg and "speculators_model_type" not in cfg:  # (vLLM speculators' drafters)
        raise ModelError(f"{what} {cfg_path}: no 'model_type' key, so the architecture is unknown")
    check_sizes(cfg, f"{what} {cfg_path}")
    return cfg


def check_sizes(cfg: dict, where: str) -> None:
    """ModelError naming the key if a size in `cfg` (or its text_config) is not a whole number
    within SIZE_RANGES; keys a config does not have are not asked for here."""
    for scope, values in (("", cfg), ("text_config.", cfg.get("text_config"))):
        if not isinstance(values, dict):
            continue
        for key, (low, high) in SIZE_RANGES.items():
            if key not in values or values[key] is None:
                continue
            v = values[key]
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ModelError(f"{where}: '{scope}{key}' must be a whole number from {low} to {high}, got {v!r}")


def text_config(cfg: dict) -> dict:
    """A flat text config (Qwen3.5 and Gemma 4 nest it under text_config)."""
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else dict(cfg)

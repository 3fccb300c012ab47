"""A model folder's config.json: read once, checked, and flattened where a wrapper nests it."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelError


def read_config(folder: Path, *, what: str = "--model") -> dict:
    """Parse and sanity-check `folder/config.json`; the errors name the file and the fix."""
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelError(
            f"{what} {folder}: no config.json in this folder, so it is not an mlx-lm model folder",
            hint="pass a folder made by mlx_lm.convert, a .gguf file, or an owner/name repo id",
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{what} {cfg_path}: malformed JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{what} {cfg_path}: expected a JSON object, got {type(cfg).__name__}")
    if "model_type" not in cfg and "speculators_model_type" not in cfg:  # (vLLM speculators' drafters)
        raise ModelError(f"{what} {cfg_path}: no 'model_type' key, so the architecture is unknown")
    return cfg


def text_config(cfg: dict) -> dict:
    """A flat text config (Qwen3.5 and Gemma 4 nest it under text_config)."""
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else dict(cfg)

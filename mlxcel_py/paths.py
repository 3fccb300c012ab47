"""Where mlxcel-py keeps its files: the cache folder and the config file. No other imports, so
every layer can ask (the BLAS shim, GGUF conversions, the config loader)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The per-user cache folder: models converted from GGUF, the BLAS shim ($MLXCEL_CACHE_DIR)."""
    env = os.environ.get("MLXCEL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxcel-py"


def config_file() -> Path:
    """The default `--config` file: $XDG_CONFIG_HOME/mlxcel/config.toml."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mlxcel" / "config.toml"

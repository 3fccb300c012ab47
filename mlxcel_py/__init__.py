"""mlxcel-py: a Python CLI mirroring mlxcel, with speculative decoding on MLX, and its Python API.

    import mlxcel_py as mc
    model = mc.load()
    print(mc.generate(model, "Fix the typos: teh cat sat on teh mat", max_tokens=32, prompt_lookup=True))

The names below load on first use (`api.py`), so importing the package (and the `mlxcel` CLI,
which does) stays free of MLX until a model is needed; see docs/api.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# mlx-lm imports transformers for its tokenizers, and transformers advises on stderr that PyTorch is
# missing and warns of prompts past a model's length (refused here in our own words): stderr keeps
# our lines alone. Set before anything in the package imports mlx-lm; a user's own settings win.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"

_API = {
    # name: (module, attribute)
    "load": ("api", "load"),
    "generate": ("api", "generate"),
    "stream": ("api", "stream"),
    "speculative_generate": ("api", "speculative_generate"),
    "Model": ("api", "Model"),
    "Generation": ("api", "Generation"),
    "GenerateOptions": ("api", "GenerateOptions"),
    "DraftPolicy": ("api", "DraftPolicy"),
    "Stats": ("api", "Stats"),
    "StreamPiece": ("api", "StreamPiece"),
    "Drafter": ("drafters.base", "Drafter"),
    "PromptLookupDrafter": ("drafters.prompt_lookup", "PromptLookupDrafter"),
    "SuffixDrafter": ("drafters.suffix", "SuffixDrafter"),
    "SuffixStore": ("drafters.suffix", "SuffixStore"),
    "FullModelDrafter": ("drafters.full_model", "FullModelDrafter"),
    "MtpDrafter": ("drafters.mtp", "MtpDrafter"),
    "DFlashDrafter": ("drafters.dflash", "DFlashDrafter"),
    "Eagle3Drafter": ("drafters.eagle3", "Eagle3Drafter"),
    "MlxcelError": ("errors", "MlxcelError"),
    "UsageError": ("errors", "UsageError"),
    "ModelError": ("errors", "ModelError"),
}
__all__ = ["__version__", *_API]

if TYPE_CHECKING:  # the names for type checkers and editors (noqa: they are re-exported)
    from .api import (  # noqa: F401
        DraftPolicy,
        GenerateOptions,
        Generation,
        Model,
        Stats,
        StreamPiece,
        generate,
        load,
        speculative_generate,
        stream,
    )
    from .drafters.base import Drafter  # noqa: F401
    from .drafters.dflash import DFlashDrafter  # noqa: F401
    from .drafters.eagle3 import Eagle3Drafter  # noqa: F401
    from .drafters.full_model import FullModelDrafter  # noqa: F401
    from .drafters.mtp import MtpDrafter  # noqa: F401
    from .drafters.prompt_lookup import PromptLookupDrafter  # noqa: F401
    from .drafters.suffix import SuffixDrafter, SuffixStore  # noqa: F401
    from .errors import MlxcelError, ModelError, UsageError  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'mlxcel_py' has no attribute {name!r}")
    import importlib

    module, attr = _API[name]
    if module.startswith("drafters"):
        importlib.import_module(f"{__name__}.api")  # the BLAS swap first (api.py), then mlx
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_API))

"""Checks on resolved models that need their config.json but no weights (run before loading).

Validation (`validate.py`) is pure: flags only. What needs a model's files lives here, next to
loading, and reads each config once through `loading.read_config` (the `ResolvedModel.config` a
resolve already parsed): a drafter's checkpoint given where a standalone model belongs, and a drafter
whose vocabulary cannot be the target's.
"""

from __future__ import annotations

from ..drafters import registry
from ..errors import ModelError
from .loading import ResolvedModel


def check_target(target: ResolvedModel) -> None:
    """A drafter's checkpoint (any kind's, registry.detected_kind) given where the model belongs."""
    kind = registry.detected_kind(target.config)
    if kind is not None:
        raise ModelError(
            f"--model {target.path} is {kind.describe(target.config)}, not a standalone model; "
            f"pass its target model as -m and this folder as --draft-model"
        )


def check_drafter(target: ResolvedModel, draft: ResolvedModel) -> None:
    """A full-model drafter against its target, from their configs."""
    cfg = draft.config
    tv, dv = target.config.get("vocab_size"), cfg.get("vocab_size")
    if not isinstance(tv, int):
        raise ModelError(
            "the target model's config.json declares no vocab_size, so a drafter cannot be checked against it"
        )
    if not isinstance(dv, int):
        raise ModelError(f"--draft-model {draft.path}: config.json declares no vocab_size")
    if dv > tv:
        raise ModelError(
            f"--draft-model {draft.path}: vocabulary ({dv}) is larger than the target's ({tv}); "
            f"the drafter must share the target's tokenizer"
        )

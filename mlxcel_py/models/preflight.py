"""Checks on resolved models that need their config.json but no weights (run before loading).

Validation (`validate.py`) is pure: flags only. What needs a model's files lives here, next to
loading, and reads each config once through `loading.read_config` (the `ResolvedModel.config` a
resolve already parsed): DFlash folders given where a standalone model belongs, and a drafter
whose vocabulary cannot be the target's.
"""

from __future__ import annotations

from ..errors import ModelError
from .loading import ResolvedModel


def is_dflash_config(cfg: dict) -> bool:
    return "dflash_config" in cfg or "DFlashDraftModel" in (cfg.get("architectures") or [])


def check_target(target: ResolvedModel) -> None:
    if is_dflash_config(target.config):
        raise ModelError(
            f"--model {target.path} is a DFlash speculative drafter, not a standalone model; "
            f"pass the target model as -m (mlxcel-py has no DFlash round loop)"
        )


def check_drafter(target: ResolvedModel, draft: ResolvedModel) -> None:
    """A full-model drafter against its target, from their configs."""
    cfg = draft.config
    if is_dflash_config(cfg):
        raise ModelError(
            f"--draft-model {draft.path} is a DFlash speculative drafter, not a standalone model; "
            f"mlxcel-py has no DFlash round loop (pass a small causal LM as --draft-model)"
        )
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

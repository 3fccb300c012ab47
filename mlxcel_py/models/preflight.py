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
    """Structural, as mlxcel checks it: a dflash_config block or a DFlash architecture."""
    return "dflash_config" in cfg or any("dflash" in str(a).lower() for a in cfg.get("architectures") or [])


def is_eagle3_config(cfg: dict) -> bool:
    """An EAGLE-3 checkpoint: an Eagle3 architecture or vLLM speculators' eagle3 algorithm."""
    archs = " ".join(str(a) for a in cfg.get("architectures") or []).lower()
    spec = cfg.get("speculators_config") if isinstance(cfg.get("speculators_config"), dict) else {}
    return "eagle3" in archs or cfg.get("speculators_model_type") == "eagle3" or spec.get("algorithm") == "eagle3"


def check_target(target: ResolvedModel) -> None:
    for kind, found in (("DFlash", is_dflash_config), ("EAGLE-3", is_eagle3_config)):
        if found(target.config):
            raise ModelError(
                f"--model {target.path} is a{'n' if kind[0] in 'AEIOU' else ''} {kind} speculative drafter, not a "
                f"standalone model; pass its target model as -m and this folder as --draft-model"
            )


def check_drafter(target: ResolvedModel, draft: ResolvedModel) -> None:
    """A full-model drafter against its target, from their configs."""
    cfg = draft.config
    if is_dflash_config(cfg):
        raise ModelError(
            f"--draft-model {draft.path} is a DFlash speculative drafter, not a standalone model; "
            f"use --draft-kind dflash (or drop --draft-kind: the folder is detected)"
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

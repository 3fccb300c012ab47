"""What mlxcel-py knows of each mlx-lm model family beyond mlx-lm's own code: one row per family.

A code path that works only for some families reads its switch here, so a new family is one row
(checked against mlx-lm 0.32's model modules). Everything not listed gets the general path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    # the forward is exactly `self.model(...)` then the tied embedding's as_linear or `lm_head`, so a
    # batched forward may run the trunk alone and skip the output layer for rows it does not need
    plain_head: bool = False
    # parallel.pipeline_stages can give each rank a run of its layers (mlx-lm's own PipelineMixin
    # models need no row: they declare `pipeline`)
    pipeline_stages: bool = False
    # its checkpoints may carry a multi-token-prediction head (drafters/mtp)
    mtp_head: bool = False


FAMILIES: dict[str, Family] = {
    "llama": Family(plain_head=True, pipeline_stages=True),
    "qwen2": Family(plain_head=True),
    "qwen3": Family(plain_head=True, pipeline_stages=True),
    "mistral": Family(pipeline_stages=True),
    "qwen3_5": Family(mtp_head=True),
    "qwen3_5_moe": Family(mtp_head=True),
    "qwen3_next": Family(mtp_head=True),
}
GENERAL = Family()


def family(model_type: str | None) -> Family:
    return FAMILIES.get(model_type or "", GENERAL)


def model_type(model: Any) -> str:
    """A loaded model's family: its mlx-lm module's name (mlx_lm.models.<model_type>)."""
    return type(model).__module__.rsplit(".", 1)[-1]


def with_mtp_heads() -> tuple[str, ...]:
    return tuple(name for name, f in FAMILIES.items() if f.mtp_head)

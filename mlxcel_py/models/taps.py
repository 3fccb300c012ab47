"""The parts of a loaded mlx-lm model that code outside its forward needs, found the same way for
every family: the text model inside a multimodal wrapper, the output layer and the embedding,
the trunk without its head, and a tap on the final norm's output (the last hidden states).

Drafters that read the target (MTP heads, assistants), the batched forward (which skips the head
for prompt rows) and distributed followers share these, so no drafter module owns them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from .families import family, model_type


def text_model(model: Any) -> tuple[Any, Any]:
    """(language model, its inner text model): Qwen3.5 and Gemma 4 wrap the text model."""
    lm = getattr(model, "language_model", model)
    return lm, lm.model


def lm_head_and_embed(model: Any) -> tuple[Callable[[mx.array], mx.array], Any]:
    """The target's lm_head (as its forward applies it, before any softcap) and embed_tokens."""
    lm, inner = text_model(model)
    tied = getattr(getattr(lm, "args", None), "tie_word_embeddings", True)
    return (inner.embed_tokens.as_linear if tied else lm.lm_head), inner.embed_tokens


def trunk_and_head(model: Any) -> tuple[Any, Callable[[mx.array], mx.array]] | None:
    """(trunk, output layer) where the family's forward is exactly trunk then head, else None."""
    if not family(model_type(model)).plain_head or not hasattr(model, "model"):
        return None
    inner = model.model
    if getattr(getattr(model, "args", None), "tie_word_embeddings", False):
        return inner, inner.embed_tokens.as_linear
    head = getattr(model, "lm_head", None)
    return (inner, head) if head is not None else None


class HiddenTap:
    """Holds the output of a model's final norm (its last hidden states) from the latest forward."""

    last: mx.array | None = None


_RECORDING: dict[type, type] = {}


def hidden_tap(model: Any) -> HiddenTap:
    """Make the model's final norm record its output (the input of its lm_head): the forward
    itself is untouched, so logits stay exactly what plain decoding computes. Idempotent."""
    _, inner = text_model(model)
    norm = inner.norm
    tap = getattr(norm, "_mlxcel_tap", None)
    if tap is None:
        base = type(norm)
        if base not in _RECORDING:

            def call(self, x, _base=base):
                out = _base.__call__(self, x)
                self._mlxcel_tap.last = out
                return out

            _RECORDING[base] = type(f"Recording{base.__name__}", (base,), {"__call__": call})
        tap = HiddenTap()
        norm._mlxcel_tap = tap  # a plain object: MLX keeps it out of the parameters
        norm.__class__ = _RECORDING[base]
    return tap

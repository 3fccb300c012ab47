"""The parts of a loaded mlx-lm model that code outside its forward needs, found the same way for
every family: the text model inside a multimodal wrapper, the output layer and the embedding,
the trunk without its head, and taps on what the forward computes on its way.

Taps are the one mechanism for drafters that read the target's hidden states: `hidden_tap` (the
final norm's output: MTP heads, assistants, distributed followers) and `layer_tap` (the outputs of
chosen decoder layers, side by side: DFlash; EAGLE-style feature drafters next). A tap only keeps
references to arrays the forward computes anyway (a recording subclass swapped in on the one
module object, or the fused layers' loop, `decoder_layers`), so logits stay the bits plain
decoding computes. Either tap's `last` is the latest forward's rows, (B, L, features); the
engine's SequenceCache keeps them per committed position (`keep_hidden`) whatever the tap.
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


class LayerRecorder:
    """What a text model's decoder layers output in its latest forward, for the layers any tap
    asked for (`outputs[i]`: layer i's output). Set on the text model as `_mlxcel_layer_recorder`;
    mlx-lm's loop records through each wanted layer's recording class, the fused layers' loop
    (`decoder_layers`) through `record`."""

    def __init__(self) -> None:
        self.wanted: set[int] = set()
        self.outputs: dict[int, mx.array] = {}

    def record(self, index: int, out: mx.array) -> None:
        if index in self.wanted:
            self.outputs[index] = out


class LayerTap:
    """The outputs of decoder layers `ids` (in that order) from the latest forward, concatenated
    on the feature axis: (B, L, len(ids) * hidden)."""

    def __init__(self, recorder: LayerRecorder, ids: tuple[int, ...]):
        self.recorder = recorder
        self.ids = ids

    @property
    def last(self) -> mx.array | None:
        outs = self.recorder.outputs
        if not all(i in outs for i in self.ids):
            return None
        return mx.concatenate([outs[i] for i in self.ids], axis=-1)


_LAYER_RECORDING: dict[type, type] = {}


def layer_tap(model: Any, ids: tuple[int, ...] | list[int]) -> LayerTap:
    """Make decoder layers `ids` of the model record their outputs (the hidden states after each
    of them, before the final norm), through the same forward plain decoding runs."""
    _, inner = text_model(model)
    layers = inner.layers
    ids = tuple(int(i) for i in ids)
    bad = [i for i in ids if not 0 <= i < len(layers)]
    if bad:
        raise ValueError(f"layer {bad[0]} is outside the model's {len(layers)} layers")
    recorder = getattr(inner, "_mlxcel_layer_recorder", None)
    if recorder is None:
        recorder = LayerRecorder()
        inner._mlxcel_layer_recorder = recorder  # a plain object: MLX keeps it out of the parameters
    for i in ids:
        if i in recorder.wanted:
            continue
        layer = layers[i]
        base = type(layer)
        if base not in _LAYER_RECORDING:

            def call(self, *args, _base=base, **kwargs):
                out = _base.__call__(self, *args, **kwargs)
                self._mlxcel_recorder.record(self._mlxcel_index, out)
                return out

            _LAYER_RECORDING[base] = type(
                f"Recording{base.__name__}", (base,), {"__call__": call, "_mlxcel_recorded": base}
            )
        layer._mlxcel_recorder, layer._mlxcel_index = recorder, i
        layer.__class__ = _LAYER_RECORDING[base]
        recorder.wanted.add(i)
    return LayerTap(recorder, ids)


def layer_recorder(inner: Any) -> LayerRecorder | None:
    """The recorder of a text model whose layers some tap reads (None: no tap)."""
    return getattr(inner, "_mlxcel_layer_recorder", None)

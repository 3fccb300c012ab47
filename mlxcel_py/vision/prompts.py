"""A conversation with images -> the token ids the engine runs (image positions as row ids).

The model's own processor (transformers', as mlx-vlm loads it) decides everything family-specific:
how many positions an image takes, the tokens around it, how pixels are resized and normalized.
The model's chat template places an image where a message's `{"type": "image"}` part is. The
image rows come from the family's own `get_input_embeddings` (mlx-vlm's), so a prompt fed here
reads exactly what mlx-vlm's generate feeds its language model.

An image keeps its ids (by its pixels' content) across prompts: a second question about it, or a
later turn of the conversation that holds it, gets them without running the vision tower again,
and the engine's prefix reuse then skips the image's prefill too.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from ..errors import ModelError
from .images import ImageError
from .target import Deferred, VisionTarget

_NOT_EXTRA = ("input_ids", "attention_mask", "pixel_values", "token_type_ids")
# what a family's merge may return beside the rows that its language model would have to read
# (Gemma 3's attention_mask_4d is not read by its language model, so it is not here)
_BESIDE_ROWS = (
    "position_ids",
    "rope_deltas",
    "visual_pos_masks",
    "deepstack_visual_embeds",
    "cross_attention_states",
    "cross_attention_mask",
    "per_layer_inputs",
    "decoder_inputs_embeds",
)
# carried for a family with mRoPE: positions (vision.target.positions) and deepstack rows
_CARRIED = ("position_ids", "rope_deltas", "visual_pos_masks", "deepstack_visual_embeds")


@dataclass
class Vision:
    """What a vision-language model adds to a text model: its processor and image token."""

    target: VisionTarget
    processor: Any
    image_token_id: int
    image_token: str
    family: str
    tokenizer: Any = None  # the engine's (mlx-lm's wrapper): its chat template where the processor has none
    _counts: dict = field(default_factory=dict, repr=False)  # an image's positions, by content key

    @property
    def placeholder(self) -> str:
        """The text that stands for one image in a raw prompt (what the processor expands)."""
        return getattr(self.processor, "boi_token", None) or self.image_token

    def render(
        self,
        tokenizer: Any,
        messages: Sequence[dict],
        *,
        add_generation_prompt: bool = True,
        continue_last: bool = False,
        extra: dict | None = None,
    ) -> str:
        """The prompt text of `messages` (contents: strings or lists of text and image parts);
        `continue_last`: the reply continues the final assistant turn; `extra`: template variables."""
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if continue_last:
            options = {"continue_final_message": True, **(extra or {})}
        else:
            options = {"add_generation_prompt": add_generation_prompt, **(extra or {})}
        for owner in (self.processor, getattr(tokenizer, "_tokenizer", tokenizer)):
            if getattr(owner, "chat_template", None):
                try:
                    return owner.apply_chat_template(list(messages), tokenize=False, **options)
                except Exception as exc:  # a template error is the user's (their messages, their template)
                    raise ModelError(f"the chat template failed on this conversation: {str(exc)[:200]}") from None
        turns = "".join(f"{m['role'].capitalize()}: {self.flat(m['content'])}\n\n" for m in messages)
        return turns + ("Assistant:" if add_generation_prompt else "")

    def prompt_ids(
        self,
        tokenizer: Any,
        prompt: str,
        images: Sequence[Any],
        *,
        system: str | None = None,
        chat_template: bool = True,
    ) -> list[int]:
        """A one-shot prompt's ids: one user turn holding `images`, then the text (generate -p)."""
        parts = [{"type": "image", "image": img} for img in images] + [{"type": "text", "text": prompt}]
        if not chat_template:
            return self.encode(self.flat(parts), images)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": parts}]
        return self.conversation_ids(tokenizer, messages)

    def conversation_ids(self, tokenizer: Any, messages: Sequence[dict], **render: Any) -> list[int]:
        """Token ids of a conversation whose content parts may hold images: `{"type": "image",
        "image": <PIL image>}`, in place among the text parts (`render`: the chat template's
        options, as `render` takes them). The template sees each part's type and text only."""
        images = [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"] if "image" in p]
        bare = [
            {**m, "content": [{k: v for k, v in p.items() if k != "image"} for p in m["content"]]}
            if isinstance(m["content"], list)
            else m
            for m in messages
        ]
        return self.encode(self.render(tokenizer, bare, **render), images)

    def flat(self, content: Any) -> str:
        if isinstance(content, str):
            return content
        return "".join(self.image_token if p.get("type") == "image" else p.get("text", "") for p in content)

    def encode(self, text: str, images: Sequence[Any]) -> list[int]:
        """Token ids of prompt `text` whose image placeholders take `images` (PIL, in order)."""
        try:
            inputs = self.processor(text=[text], images=list(images) or None, return_tensors="np")
        except Exception as exc:  # the processor's refusal of an input: one line, never a traceback
            raise ImageError(f"the model's processor refused the prompt's images: {str(exc)[:200]}") from None
        ids = np.asarray(inputs["input_ids"])[0].astype(np.int64)
        bos = getattr(getattr(self.processor, "tokenizer", self.processor), "bos_token_id", None)
        if bos is not None and ids.size > 1 and ids[0] == ids[1] == bos:
            ids = ids[1:]  # the template wrote BOS and the processor's tokenizer added another
        at = np.flatnonzero(ids == self.image_token_id)
        if not images:
            return ids.tolist()
        if at.size == 0:
            raise ImageError(
                "the chat template put no image into the prompt; this model's template does not take images"
            )
        grids = self._grids(inputs)
        keys = self._keys(images, at.size, grids)
        held = [self.target.images.known(k) for k, _ in keys]
        if any(h is None for h in held):  # the vision tower runs once for the prompt, when first fed
            deferred = Deferred(functools.partial(self._image_rows, ids, at, inputs))
            start = 0
            for i, (k, n) in enumerate(keys):
                if held[i] is None:
                    held[i] = self.target.images.add(k, deferred, start, n, grids[i] if grids else None)
                start += n
        rows = [r for h in held for r in h]
        out = ids.tolist()
        for i, r in zip(at.tolist(), rows):
            out[i] = r
        return out

    def _image_rows(self, ids: np.ndarray, at: np.ndarray, inputs: Any) -> list[mx.array]:
        """The prompt's image rows, from the family's own merge (run on the model's thread), and
        the rows a family adds at deeper layers (Qwen3-VL's deepstack), if any."""
        extras = {k: _mx(v) for k, v in inputs.items() if k not in _NOT_EXTRA}
        mask = mx.ones((1, ids.size), dtype=mx.int32)  # one unpadded prompt (Gemma 3 reads it)
        try:
            merged = self.target.vlm.get_input_embeddings(
                mx.array(ids.astype(np.int32))[None], _mx(np.asarray(inputs["pixel_values"])), mask=mask, **extras
            )
        except Exception as exc:  # mlx-vlm's code on an input it does not take: one line
            raise ModelError(
                f"the {self.family} vision tower failed on this prompt's images: {str(exc)[:200]}"
            ) from None
        carried = _CARRIED if self.target.mrope else ()  # vision.target passes these
        if needs := [k for k in _BESIDE_ROWS if k not in carried and getattr(merged, k, None) is not None]:
            raise ModelError(
                f"this {self.family} model needs {', '.join(needs)} beside the image rows (not supported yet)"
            )
        rows = [merged.inputs_embeds[0][mx.array(at.astype(np.int32))]]
        deep = merged.deepstack_visual_embeds
        return rows + (list(deep) if deep is not None else [])  # one row per image position already

    def _grids(self, inputs: Any) -> list[tuple[int, int, int]] | None:
        """Each image's (t, h, w) grid of positions, for a family with mRoPE (None otherwise)."""
        if not self.target.mrope:
            return None
        merge = self.target.vlm.config.vision_config.spatial_merge_size
        rows = np.asarray(inputs["image_grid_thw"]).reshape(-1, 3).tolist()
        return [(int(t), int(h) // merge, int(w) // merge) for t, h, w in rows]

    def _keys(self, images: Sequence[Any], positions: int, grids: list | None = None) -> list[tuple[bytes, int]]:
        """(content key, positions) of each image, in prompt order, so an image keeps its ids
        when the conversation around it grows (a later turn adds another). Where one image's
        positions do not add up (a processor that lays images out together), all the prompt's
        images share one key."""
        keys = [_image_key(img) for img in images]
        if grids is not None:  # mRoPE: each image's grid says its positions
            counts = [t * h * w for t, h, w in grids]
            if len(counts) != len(images) or sum(counts) != positions:
                raise ModelError(f"the {self.family} processor's image grids do not match the prompt's image tokens")
            return list(zip(keys, counts))
        if len(images) == 1:
            return [(keys[0], positions)]
        counts = [self._positions(img, k) for img, k in zip(images, keys)]
        if sum(counts) != positions:
            return [(hashlib.sha256(b"".join(keys)).digest(), positions)]
        return list(zip(keys, counts))

    def _positions(self, image: Any, key: bytes) -> int:
        if key not in self._counts:
            text = self.render(None, [{"role": "user", "content": [{"type": "image"}]}])
            ids = np.asarray(self.processor(text=[text], images=[image], return_tensors="np")["input_ids"])
            self._counts[key] = int((ids == self.image_token_id).sum())
            if len(self._counts) > 256:
                self._counts.pop(next(iter(self._counts)))
        return self._counts[key]


def _image_key(image: Any) -> bytes:
    """A PIL image's content key: its mode, size and pixels."""
    h = hashlib.sha256(f"{image.mode}{image.size}".encode())
    h.update(image.tobytes())
    return h.digest()


def _mx(v: Any) -> Any:
    return mx.array(v) if isinstance(v, np.ndarray) else v

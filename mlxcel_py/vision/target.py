"""A vision-language model as the engine sees it: token ids in, logits out.

The engine, its drafters and its caches speak token ids only. An image enters a prompt as rows of
embeddings (the vision tower's output, projected) at the positions of the model's image token, so
here an image position carries a *negative* id that names its row: -(1 + slot * ROWS + row), where
`slot` stands for one image (by its pixels' content) in `ImageRows`. The
forward embeds ids >= 0 as the model's own text path does and puts the image rows in place of the
negative ones; everything after the prompt (drafts, verify blocks, plain steps) is text.

Why ids and not a side channel: every consumer of the token list stays right without knowing about
images. Prefix reuse (engine.prompt_cache, the server's slots) matches a second question about the
same image (same pixels, same ids) and never a different image (other ids); rollback replays and
chunked prefill feed the same rows wherever a chunk falls. Drafters never propose a negative id
(engine.verify cuts a draft there), and the target never picks one, so no image id is ever output.

The caches are mlx-lm's (a plain KV cache; a rotating one where the family slides a window), so
rollback and every cache adapter in models.cache_kinds apply unchanged.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ModelError

ROWS = 1 << 15  # positions one image may take (a 1024 px Pixtral image takes ~4,100)
SLOTS = 1 << 16  # -(1 + SLOTS * ROWS) still fits int32; slot numbers are not reused before this many


class Deferred:
    """Image rows computed when a forward first reads them: on the thread that runs the model (a
    server builds prompts on other threads; only the model's thread runs MLX). One vision-tower
    run serves every image of its prompt; each image's slot takes its slice. `compute` gives a
    list: the image rows, then any deeper layers' rows (Qwen3-VL's deepstack)."""

    def __init__(self, compute: Callable[[], list[mx.array]]):
        self._compute = compute
        self._value: list[mx.array] | None = None

    def value(self) -> list[mx.array]:
        if self._value is None:
            self._value = self._compute()
            mx.eval(self._value)
            self._compute = None  # the pixels go
        return self._value


class ImageRows:
    """The rows of recent images, by content key; `keep` images' worth are held. Prompt builders
    (any thread) add and look up; the model's forward reads."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._slots: OrderedDict[bytes, int] = OrderedDict()  # key -> slot, oldest first
        self._rows: dict[int, tuple[Any, int, int]] = {}  # slot -> (mx rows or Deferred, start, n)
        self._grids: dict[int, tuple[int, int, int]] = {}  # slot -> (t, h, w) of its positions (mRoPE)
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def known(self, key: bytes) -> list[int] | None:
        """The ids of an image seen before (its rows are held), else None."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                return None
            self._slots.move_to_end(key)
            return ids_of(slot, self._rows[slot][2])

    def grid(self, slot: int) -> tuple[int, int, int]:
        with self._lock:
            grid = self._grids.get(slot)
        if grid is None:
            raise ModelError("an image's rows were let go before its prompt was fed; send the image again")
        return grid

    def add(self, key: bytes, rows: Any, start: int, n: int, grid: tuple[int, int, int] | None = None) -> list[int]:
        """An image's `n` rows: rows[start:start + n] of `rows` (an array or a Deferred); `grid`:
        where its positions sit in time, height and width (a family with mRoPE)."""
        if n > ROWS:
            raise ModelError(f"an image takes {n} positions, more than {ROWS}")
        if (ids := self.known(key)) is not None:
            return ids
        with self._lock:
            slot, self._next = self._next, (self._next + 1) % SLOTS
            self._slots[key] = slot
            self._rows[slot] = (rows, start, n)
            self._grids[slot] = grid or (1, 1, n)
            while len(self._slots) > self.keep:
                _, old = self._slots.popitem(last=False)
                self._rows.pop(old, None)
                self._grids.pop(old, None)
        return ids_of(slot, n)

    def _held(self, slot: int) -> list[mx.array]:
        """The slot's rows: the image rows, then any rows its family adds at deeper layers
        (Qwen3-VL's deepstack), each (n, hidden)."""
        with self._lock:
            entry = self._rows.get(slot)
        if entry is None:
            raise ModelError("an image's rows were let go before its prompt was fed; send the image again")
        rows, start, n = entry
        if isinstance(rows, Deferred):
            rows = [r[start : start + n] for r in rows.value()]
            with self._lock:
                if slot in self._rows:
                    self._rows[slot] = (rows, 0, n)
        return rows

    def rows(self, ids: np.ndarray) -> list[mx.array]:
        """The rows negative `ids` name, in order (one gather per image): the image rows, then
        each deeper layer's rows where the family has them."""
        code = -ids.astype(np.int64) - 1
        slots, rows = code // ROWS, code % ROWS
        parts: list[list[mx.array]] = []
        order = []
        for slot in np.unique(slots):
            held = self._held(int(slot))
            pick = mx.array(rows[np.flatnonzero(slots == slot)].astype(np.int32))
            parts.append([h[pick] for h in held])
            order.append(np.flatnonzero(slots == slot))
        at = np.concatenate(order)
        back = None if (np.diff(at) > 0).all() else mx.array(np.argsort(at).astype(np.int32))
        out = []
        for k in range(len(parts[0])):
            joined = mx.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k]
            out.append(joined if back is None else joined[back])
        return out


def ids_of(slot: int, n: int) -> list[int]:
    base = slot * ROWS
    return [-(1 + base + r) for r in range(n)]


class VisionTarget(nn.Module):
    """The engine's model: the VLM's language model, with image rows where ids are negative."""

    takes_image_ids = True  # engine.cache feeds its negative ids as they are

    def __init__(self, vlm: nn.Module):
        super().__init__()
        self.vlm = vlm
        self.text: nn.Module | None = None  # mlx-lm's model of the text decoder, where it runs
        self.images = ImageRows()
        # a family whose image positions are (time, height, width) triples (mRoPE: Qwen2-VL)
        self.mrope = hasattr(vlm.language_model, "get_rope_index")

    def run_text_with(self, text: nn.Module) -> None:
        """Decode with `text` (mlx-lm's model of the text decoder, holding its weights):
        models.loading puts it on the CPU kernels as any text model."""
        self.text = text

    @property
    def kernel_model(self) -> nn.Module:
        """The module whose attention the CPU kernels dispatch (cpu.kernels): the mlx-lm text
        decoder where it runs, so a server batches this model's rows as a text model's."""
        return self.text if self.text is not None else self

    @property
    def layers(self):
        return self.text.layers if self.text is not None else self.vlm.language_model.layers

    @property
    def language_model(self):
        """The text decoder that runs (models.taps reads it: the KV cache type, hidden states)."""
        return self.text if self.text is not None else self.vlm.language_model

    def make_cache(self) -> list:
        if self.text is not None:
            from mlx_lm.models.cache import make_prompt_cache

            return make_prompt_cache(self.text)
        return mlx_lm_caches(self.vlm.language_model)

    def text_embeddings(self, ids: mx.array) -> mx.array:
        """Text positions' embeddings beside image rows: the decoder's own embedding, as a text
        step reads it (mlx-vlm's merge for a family whose decoder is its own)."""
        embed = getattr(getattr(self.text, "model", None), "embed_tokens", None)
        return embed(ids) if embed is not None else self.vlm.get_input_embeddings(ids, None).inputs_embeds

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        if self.mrope:
            return self._mrope_forward(np.array(inputs), cache)
        if len(self.images):
            ids = np.array(inputs)
            image = ids < 0
            if image.any():
                text = mx.array(np.where(image, 0, ids).astype(np.int32))
                h = self.text_embeddings(text)
                b, L, d = h.shape
                flat = h.reshape(b * L, d)
                where = np.flatnonzero(image.reshape(-1))
                flat[mx.array(where)] = self.images.rows(ids.reshape(-1)[where])[0].astype(flat.dtype)
                h = flat.reshape(b, L, d)
                if self.text is not None:
                    return self.text(text, cache=cache, input_embeddings=h)
                return self.vlm.language_model(text, cache=cache, inputs_embeds=h).logits
        if self.text is not None:
            return self.text(inputs, cache=cache)
        return self.vlm.language_model(inputs, cache=cache).logits

    def _mrope_forward(self, ids: np.ndarray, cache: Any) -> mx.array:
        """A family with mRoPE: each position is a (time, height, width) triple, passed to its
        language model explicitly (`positions`), so nothing of one prompt stays in the model."""
        image = ids < 0
        text = mx.array(np.where(image, 0, ids).astype(np.int32))
        h, beside = None, {}
        if image.any():
            h = self.text_embeddings(text)
            b, L, d = h.shape
            flat = h.reshape(b * L, d)
            where = np.flatnonzero(image.reshape(-1))
            rows, *deep = self.images.rows(ids.reshape(-1)[where])
            flat[mx.array(where)] = rows.astype(flat.dtype)
            h = flat.reshape(b, L, d)
            if deep:  # Qwen3-VL: rows added at its first layers, at the image's positions
                beside = {"visual_pos_masks": mx.array(image), "deepstack_visual_embeds": deep}
        pos = positions(self.images, ids.reshape(-1), cache)
        return self.vlm.language_model(text, cache=cache, inputs_embeds=h, position_ids=pos, **beside).logits


def positions(images: ImageRows, ids: np.ndarray, cache: Any) -> mx.array:
    """(3, 1, L) mRoPE positions of `ids`, fed at the cache's offset (Qwen2-VL's rule: a text
    token's three positions are one past the largest position before it; an image's tokens sit at
    base + (t, h, w) of their place in its grid, base one past the largest position before it).
    The cache's first layer keeps every fed position's triple, so trims and reused prefixes just
    read the kept ones; a position's triple depends only on the tokens before it."""
    c0 = cache[0] if cache else None
    offset = getattr(c0, "offset", None)
    if not isinstance(offset, int):  # a batched forward's RowCaches: one sequence at a time here
        raise TypeError("mRoPE positions are kept per sequence; this model runs one sequence a forward")
    table = c0.__dict__.setdefault("mlxcel_positions", [])
    if len(table) < offset:  # fed without this table (a text-only slot file): positions = indices
        table.extend((i, i, i) for i in range(len(table), offset))
    del table[offset:]
    prev = table[-1] if table else None
    for t in ids.tolist():
        if t >= 0:
            p = max(prev) + 1 if prev else 0
            pos = (p, p, p)
        else:
            slot, row = divmod(-t - 1, ROWS)
            gt, gh, gw = images.grid(slot)
            if row == 0:
                base = max(prev) + 1 if prev else 0
            else:  # the previous token is this image's row - 1, at base + its (t, h, w)
                base = prev[0] - (row - 1) // (gh * gw)
            pos = (base + row // (gh * gw), base + (row // gw) % gh, base + row % gw)
        table.append(pos)
        prev = pos
    return mx.array(np.array(table[offset:], dtype=np.int32).T[:, None, :])


def mlx_lm_caches(lm: nn.Module) -> list:
    """mlx-lm caches in the kinds the family's own `make_cache` picks (mlx-vlm has its own classes
    of the same names; mlx-lm's are the ones every rollback adapter knows)."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    if not hasattr(lm, "make_cache"):
        return [KVCache() for _ in lm.layers]
    out = []
    for c in lm.make_cache():
        kind = type(c).__name__
        if kind in ("KVCache", "SimpleKVCache"):
            out.append(KVCache())
        elif kind == "RotatingKVCache":
            out.append(RotatingKVCache(max_size=c.max_size, keep=getattr(c, "keep", 0)))
        else:
            raise ModelError(f"this vision model's {kind} layer cache is not supported yet (plain and sliding KV are)")
    return out

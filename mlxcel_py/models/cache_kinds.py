"""One adapter per kind of mlx-lm cache: how a rollback checkpoints it, restores it and drops its
newest positions.

mlx-lm's caches own `trim`, and it undoes a write only for plain KV caches. The other kinds need
state mlx-lm keeps private (a rotating window's write index `_idx` and its `_temporal_order`), so
every read and write of it is here, next to the kind it belongs to (checked against mlx-lm 0.32).
`adapter_for(cache)` picks the adapter; `engine.cache.SequenceCache` drives them.

- Trim: KVCache, QuantizedKVCache, ConcatenateKVCache, ChunkedKVCache. mlx-lm's `trim`, O(1).
- Window: RotatingKVCache. A block of S > 1 tokens goes through `_update_concat`, which leaves
  the rows in temporal order (max_size - 1 + S of them), so dropping the newest n < S rows is a
  slice. After single-token (in-place, rotating) writes the checkpoint is restored instead.
- State: ArraysCache (conv and recurrent state) and any other cache a trim cannot undo. The
  layers replace these arrays rather than mutate them, so a checkpoint is a shallow copy of
  references (no array is copied); rolling back restores it and the kept tokens are replayed.
- List: CacheList, each part by its own kind.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

TRIM, WINDOW, STATE, LIST = "trim", "window", "state", "list"


def _trim(c: Any, n: int) -> None:
    got = c.trim(n)
    assert got == n, f"cache rollback trimmed {got} of {n} tokens"


class Trim:
    name = TRIM

    @staticmethod
    def snapshot(c: Any) -> Any:
        return None  # a trim undoes any write

    @staticmethod
    def restore(c: Any, snap: Any, since: int) -> None:
        _trim(c, since)

    @staticmethod
    def can_rewind(c: Any, n: int, last_write: int) -> bool:
        return True

    @staticmethod
    def rewind(c: Any, n: int) -> None:
        _trim(c, n)

    @staticmethod
    def time_ordered(c: Any) -> tuple[mx.array, mx.array, int]:
        return c.keys[..., : c.offset, :], c.values[..., : c.offset, :], c.offset


class Window:
    name = WINDOW

    @staticmethod
    def snapshot(c: Any) -> Any:
        # single-token writes assign into the buffer in place; a new array object keeps the old rows
        copy = lambda a: None if a is None else mx.array(a)
        return (copy(c.keys), copy(c.values), c.offset, c._idx)

    @staticmethod
    def restore(c: Any, snap: Any, since: int) -> None:
        c.keys, c.values, c.offset, c._idx = snap

    @staticmethod
    def can_rewind(c: Any, n: int, last_write: int) -> bool:
        if c.keys is None:
            return False
        # nothing rotated out yet: the rows are positions 0..offset-1 in order (a prompt cache
        # reused for a shorter prefix, within the window)
        if c.offset == c._idx and n < c.offset:
            return True
        # the last write was one concat block (temporal order) and keeps at least one of its rows
        return last_write > 1 and n < last_write and c._idx == c.keys.shape[2]

    @staticmethod
    def rewind(c: Any, n: int) -> None:
        end = c._idx - n  # in temporal order: slice off the newest rows
        c.keys, c.values = c.keys[..., :end, :], c.values[..., :end, :]
        c.offset -= n
        c._idx = end

    @staticmethod
    def time_ordered(c: Any) -> tuple[mx.array, mx.array, int]:
        n = min(c.offset, c.max_size)
        return c._temporal_order(c.keys)[..., -n:, :], c._temporal_order(c.values)[..., -n:, :], n


class State:
    name = STATE

    @staticmethod
    def snapshot(c: Any) -> Any:
        # the layers rebind these attributes (and list items); copying the lists is enough
        return {k: (list(v) if isinstance(v, list) else v) for k, v in vars(c).items()}

    @staticmethod
    def restore(c: Any, snap: Any, since: int) -> None:
        for k, v in snap.items():
            setattr(c, k, list(v) if isinstance(v, list) else v)

    @staticmethod
    def can_rewind(c: Any, n: int, last_write: int) -> bool:
        return False  # only a checkpoint brings a recurrent state back

    @staticmethod
    def rewind(c: Any, n: int) -> None:
        raise AssertionError("a state cache is rolled back through its checkpoint")


class List:
    name = LIST

    @staticmethod
    def snapshot(c: Any) -> Any:
        return [adapter_for(p).snapshot(p) for p in c.caches]

    @staticmethod
    def restore(c: Any, snap: Any, since: int) -> None:
        for part, s in zip(c.caches, snap):
            adapter_for(part).restore(part, s, since)

    @staticmethod
    def can_rewind(c: Any, n: int, last_write: int) -> bool:
        return all(adapter_for(p).can_rewind(p, n, last_write) for p in c.caches)

    @staticmethod
    def rewind(c: Any, n: int) -> None:
        for p in c.caches:
            adapter_for(p).rewind(p, n)


_TRIM_TYPES = (KVCache, QuantizedKVCache, ConcatenateKVCache, ChunkedKVCache)


def reserve(
    c: KVCache, n: int, heads: int, dim: int, dtypes: tuple[mx.Dtype, mx.Dtype] = (mx.float32, mx.float32)
) -> None:
    """Room for n more positions in a KVCache's buffers, grown as mlx-lm's update_and_fetch grows
    them (whole steps of c.step positions), for ops that write the buffers themselves (the batched
    cache attention, the fused decoder layers); later mlx-lm writes find the layout they expect.
    A new cache's buffers take `dtypes` (keys, values: the cache type, --cache-type-k/-v); a cache
    that holds rows keeps the type they were written in."""
    prev = c.offset
    if c.keys is not None and prev + n <= c.keys.shape[2]:
        return
    steps = (c.step + n - 1) // c.step
    if c.keys is None:  # a cache given a type (store_as) keeps it whoever writes first
        k_type, v_type = getattr(c, "kv_store", dtypes)
    else:
        k_type, v_type = c.keys.dtype, c.values.dtype
    new_k = mx.zeros((1, heads, steps * c.step, row_width(dim, k_type)), k_type)
    new_v = mx.zeros((1, heads, steps * c.step, row_width(dim, v_type)), v_type)
    if c.keys is None:
        c.keys, c.values = new_k, new_v
        return
    if prev % c.step != 0:
        c.keys, c.values = c.keys[..., :prev, :], c.values[..., :prev, :]
    c.keys = mx.concatenate([c.keys, new_k], axis=2)
    c.values = mx.concatenate([c.values, new_v], axis=2)


STORABLE = (KVCache, RotatingKVCache)  # the kinds `store_as` gives a cache type


def store_as(c: Any, dtypes: tuple[mx.Dtype, mx.Dtype]) -> None:
    """Make a plain or sliding KV cache that mlx-lm's layer code writes hold its rows at `dtypes`
    (keys, values: float16 or bfloat16, --cache-type-k/-v): each write is rounded once, as it
    comes in, so the buffers mlx-lm grows take that type and a row reads back the same bits
    whichever forward wrote it. (mlx-lm sizes new buffers by the incoming rows' dtype and a
    concatenation of two types promotes, so the rows are cast before its update, not after.)"""
    k_type, v_type = dtypes
    update = type(c).update_and_fetch

    def update_and_fetch(keys: mx.array, values: mx.array):
        return update(c, keys.astype(k_type), values.astype(v_type))

    c.update_and_fetch = update_and_fetch  # on the instance: the class, and what it saves as, stay mlx-lm's
    c.kv_store = dtypes  # `reserve` gives a new buffer these types


def row_width(dim: int, dtype: mx.Dtype) -> int:
    """Elements of one KV row of `dim` values at a buffer dtype: int8 is q8_0 (csrc
    attention_kernel.h: dim int8, then dim/32 float16 scales), uint8 q4_0 (dim/2 bytes of
    nibbles, then the scales); the others hold the values as they are."""
    if dtype == mx.int8:
        return dim + dim // 16
    return dim // 2 + dim // 16 if dtype == mx.uint8 else dim


BLOCK_DTYPES = (mx.int8, mx.uint8)  # q8_0, q4_0: blocks of 32 values written by the kernels only


def adapter_for(c: Any):
    """The adapter for one cache object."""
    if isinstance(c, RotatingKVCache):
        return Window
    if isinstance(c, CacheList):
        return List
    if isinstance(c, _TRIM_TYPES):
        return Trim
    return State  # ArraysCache and caches of other families: checkpoint and replay


def rollback_kind(c: Any) -> str:
    return adapter_for(c).name


def leaves(layers: Sequence[Any]) -> Iterator[Any]:
    """Every cache object below a model's layer list, CacheList parts in place of the list."""
    for c in layers:
        if adapter_for(c) is List:
            yield from leaves(c.caches)
        else:
            yield c


def describe_kinds(layers: Sequence[Any]) -> str:
    """'trim x30' / 'state x3, trim x1': what the rollback of a model's caches uses."""
    counts: dict[str, int] = {}
    for c in leaves(layers):
        k = rollback_kind(c)
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in counts.items())


def why_not_rollback(layers: Sequence[Any]) -> str | None:
    """Why these caches cannot be rolled back exactly, or None. A checkpoint copies attributes, so a
    cache object without them (a C extension type, __slots__ only) is the one impossible case."""
    for c in leaves(layers):
        if adapter_for(c) is State and not hasattr(c, "__dict__"):
            return f"its {type(c).__name__} cache keeps its state where a checkpoint cannot copy it"
    return None


def trim_only(layers: Sequence[Any]) -> bool:
    return all(adapter_for(c) is Trim for c in leaves(layers))


def time_ordered(c: Any) -> tuple[mx.array, mx.array, int]:
    """A KV cache's keys and values in time order and how many positions they cover (a window
    keeps its last max_size)."""
    return adapter_for(c).time_ordered(c)

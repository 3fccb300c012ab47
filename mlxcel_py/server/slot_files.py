"""llama-server's slot files (`--slot-save-path DIR`, `POST /slots/{id}?action=save|restore|erase`):
a prompt's KV cache written to a file and read back later, so a long prompt is fed once.

Slots here share one prompt cache (engine/prompt_cache.py: finished requests' caches, taken by
the next prompt sharing a prefix) instead of each holding its own, so `save` writes the most
recently finished request's cache whatever the slot id, `restore` puts the file's cache in the
pool (the next request whose prompt shares its prefix starts from it), and `erase` empties the
pool. The file is mlx-lm's prompt-cache format (safetensors: every layer cache's state and
class) with the token ids it holds. A file is restored only into a model whose caches have the
same kinds and shapes (a fresh cache after one token is the yardstick), so another model's file is
refused, not decoded as garbage. Everything here runs on the worker's thread (Worker.call), the
only thread that runs the model.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .http import ApiError

MAX_NAME = 255
# q8_0 and q4_0 KV rows are stored rotated (csrc attention_kernel.cpp, rotate()); a file holding
# such rows says so, and one that does not was written before the rotation: its rows would read
# as other values, so it is refused
BLOCK_ROWS = ("kv_block_rows", "rotated")
_FORBIDDEN = set('/\\:*?"<>|')


def check_filename(name: Any) -> str:
    """llama-server's rule (fs_validate_filename, in short): one plain file name, no folders."""
    ok = (
        isinstance(name, str)
        and 0 < len(name.encode()) <= MAX_NAME
        and name not in (".", "..")
        and name == name.strip()
        and not name.endswith(".")
        and not any(c in _FORBIDDEN or ord(c) < 32 or ord(c) == 127 for c in name)
    )
    if not ok:
        raise ApiError("Invalid filename")
    return name


def save(engine: Any, path: Path) -> tuple[int, int]:
    """Write the newest pooled cache to `path`: (tokens, bytes written)."""
    from mlx_lm.models.cache import save_prompt_cache

    pool = _pool(engine)
    cache = pool.take_latest()
    if cache is None:
        raise ApiError("no prompt is cached yet: send a request first, then save")
    if cache.tokens and min(cache.tokens) < 0:  # an image's ids name rows this process holds
        pool.give(cache)
        raise ApiError("the cached prompt holds an image; slot files keep text prompts only")
    try:
        tmp = path.with_name(path.name + ".partial.safetensors")  # mlx names by extension
        save_prompt_cache(str(tmp), cache.layers, {"tokens": json.dumps(cache.tokens), BLOCK_ROWS[0]: BLOCK_ROWS[1]})
        os.replace(tmp, path)  # whole or absent: a reader never sees half a file
        return len(cache.tokens), path.stat().st_size
    except OSError as exc:
        raise ApiError(f"cannot write slot file {path.name}: {exc.strerror or exc}", status=500) from None
    finally:
        pool.give(cache)


def restore(engine: Any, path: Path) -> tuple[int, int]:
    """Read `path` into the pool: (tokens, bytes read)."""
    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache

    from ..engine.cache import SequenceCache
    from ..models import kv_cache

    pool = _pool(engine)
    if not path.is_file():
        raise ApiError(f"no slot file {path.name} in --slot-save-path", status=404, type="not_found_error")
    invalid = "Unable to restore slot, no available space in KV cache or invalid slot save file"
    try:
        with tempfile.TemporaryDirectory() as tmp:  # mlx reads a file by its extension: a link named so
            link = Path(tmp) / "slot.safetensors"
            link.symlink_to(path.resolve())
            layers, meta = load_prompt_cache(str(link), return_metadata=True)
            mx.eval([c.state for c in layers])  # read now, while the link exists
        tokens = json.loads(meta["tokens"])
    except Exception:
        raise ApiError(invalid) from None
    cache = SequenceCache(engine.model, engine.channel)
    if not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) and _fits(engine, layers, tokens)):
        raise ApiError(invalid)
    if meta.get(BLOCK_ROWS[0]) != BLOCK_ROWS[1] and _holds_blocks(layers):
        raise ApiError(
            f"{invalid}: its q8_0/q4_0 rows were written by an earlier version, which stored them unrotated; save it again"
        )
    kv_cache.store_caches(engine.model, layers)  # later writes keep the file's f16/bf16 rows at their type
    cache.layers, cache.tokens = layers, tokens
    pool.give(cache)
    return len(tokens), path.stat().st_size


def erase(engine: Any) -> int:
    """Empty the pool: the tokens its caches held."""
    return _pool(engine).clear()


def _pool(engine: Any):
    if engine.prompt_cache is None:
        raise ApiError("slot files need the prompt cache, which --cache-ram 0 (or a distributed run) turns off")
    return engine.prompt_cache


def _fits(engine: Any, layers: list, tokens: list[int]) -> bool:
    """The file's caches are this model's: same count, kinds and state shapes (the sequence axis
    aside) as a fresh cache after one token, and as many positions as tokens."""
    import mlx.core as mx

    from ..engine.cache import SequenceCache, _arrays

    fresh = SequenceCache(engine.model, engine.channel)
    mx.eval(fresh.feed([0]))
    if len(layers) != len(fresh.layers) or not tokens:
        return False
    for got, want in zip(layers, fresh.layers):
        if type(got) is not type(want):
            return False
        a, b = _arrays(got.state), _arrays(want.state)
        if len(a) != len(b) or any(x.ndim != y.ndim or _shape(x) != _shape(y) for x, y in zip(a, b)):
            return False
        if getattr(got, "offset", len(tokens)) != len(tokens):
            return False
    return all(0 <= t < (engine.vocab_size or 2**31) for t in tokens)


def _holds_blocks(layers: list) -> bool:
    """Whether any cache holds q8_0 or q4_0 rows (int8, uint8 buffers)."""
    import mlx.core as mx

    from ..engine.cache import _arrays

    return any(x.dtype in (mx.int8, mx.uint8) for c in layers for x in _arrays(c.state))


def _shape(a: Any) -> tuple:
    """A state array's shape without its sequence axis (KV: batch, heads, positions, dim)."""
    return tuple(a.shape[:2]) + tuple(a.shape[3:]) if a.ndim == 4 else tuple(a.shape)

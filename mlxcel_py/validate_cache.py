"""Validation of the KV cache type flags (--cache-type-k/-v, mlx-lm's --kv-bits/--kv-group-size).

Part of the validation layer (validate.py calls `cache_types` before anything loads): a typo is
exit 2, llama.cpp's names that have no kernel here yet run as q8_0 with a note, and mlx-lm's
spelling becomes the cache types it names, so the loader sees one pair of names.
"""

from __future__ import annotations

from dataclasses import replace

from .errors import UsageError
from .options import CACHE_TYPES, KV_BITS, KV_GROUP_SIZES, LATER_CACHE_TYPES, CommandOptions, ModelOptions


def cache_types(opts: CommandOptions) -> tuple[CommandOptions, tuple[str, ...]]:
    """A typo is refused; llama.cpp's types that are not built here (a llama-server command line's
    `-ctk q5_1`) run as q8_0, with a note: the nearest built type at least as precise as each of
    them, and still a quarter of float32's bytes, so such command lines start and save memory."""
    notes, chosen = [], []
    types = _kv_bits(opts.model)
    for flag, value in zip(("--cache-type-k", "--cache-type-v"), types):
        if value in LATER_CACHE_TYPES:
            notes.append(
                f"{flag} {value} is not built here; the KV cache runs as q8_0, the nearest type at least as "
                f"precise ({', '.join(CACHE_TYPES)} are built)"
            )
            value = "q8_0"
        elif value not in CACHE_TYPES:
            raise UsageError(f"{flag} {value} is not one of {', '.join(CACHE_TYPES)} (or llama.cpp's names)")
        chosen.append(value)
    model = replace(opts.model, cache_type_k=chosen[0], cache_type_v=chosen[1])
    return replace(opts, model=model), tuple(notes)


def _kv_bits(m: ModelOptions) -> tuple[str, str]:
    """mlx-lm's --kv-bits / --kv-group-size as the cache types they name (both keys and values)."""
    if m.kv_bits is None:
        if m.kv_group_size is not None:
            raise UsageError("--kv-group-size goes with --kv-bits; use --kv-bits 8 (or --cache-type-k/-v q8_0)")
        return m.cache_types
    if m.kv_bits not in KV_BITS:
        raise UsageError(f"--kv-bits {m.kv_bits} is not one of {', '.join(map(str, KV_BITS))}; use --kv-bits 8")
    if m.kv_group_size is not None and m.kv_group_size not in KV_GROUP_SIZES:
        raise UsageError(
            f"--kv-group-size {m.kv_group_size} is not one of {', '.join(map(str, KV_GROUP_SIZES))} "
            f"(q8_0's and q4_0's blocks are 32 values); drop it or use 32"
        )
    if m.cache_types != ("auto", "auto"):
        raise UsageError("--kv-bits names the cache type; drop it or --cache-type-k/--cache-type-v")
    return (KV_BITS[m.kv_bits],) * 2

"""Context shift (llama-server's `--context-shift`): a generation that fills its window goes on
after dropping part of the context, instead of stopping.

When the window is full, the first `keep` tokens stay, the next `discard` go (half of what
follows the kept head, unless the request says how many), and the rest move down: llama.cpp's
rule and counts. llama.cpp removes the positions from its KV cache and rotates the kept keys'
RoPE by the distance they moved; mlx-lm's caches can only be cut at the end and a rotation is
each family's own (scaled, partial, multi-section RoPE), so here the cache is cut back to the
kept head and the moved tail is fed again: one prefill of about half a window per shift, and
every kept position holds what a fresh prompt of the shifted tokens gives it.

A shift happens exactly when the sequence reaches the window, and a round never drafts past
that point (`room`), so plain and speculative decoding shift at the same tokens and their output
stays equal token for token.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .generation import RoundLoop, _Decoding

# llama.cpp keeps at least this many positions free of the kept head
_MIN_MOVED = 4


@dataclass(frozen=True)
class ContextShift:
    """How a request shifts: `keep` tokens from the start stay (-1: the whole prompt), `discard`
    go after them at each shift (0: half of the rest)."""

    keep: int = 0
    discard: int = 0

    def plan(self, n_tokens: int, prompt_len: int, window: int) -> tuple[int, int]:
        """(kept head, dropped) for a sequence of n_tokens (the newest not yet fed) in `window`."""
        keep = prompt_len if self.keep < 0 else self.keep
        keep = max(0, min(window - _MIN_MOVED, keep, n_tokens - 2))
        left = n_tokens - 1 - keep  # fed positions after the kept head
        discard = self.discard if self.discard > 0 else left // 2
        return keep, max(1, min(discard, left))


def configured(keep: int, prompt: list[int], bos: int | None, discard: int = 0) -> ContextShift:
    """--keep N (or a request's n_keep) as llama.cpp counts it: without the BOS the prompt starts
    with, which llama.cpp adds and keeps."""
    if keep >= 0 and bos is not None and prompt[:1] == [bos]:
        keep += 1
    return ContextShift(keep=keep, discard=discard)


def room(loop: RoundLoop, d: _Decoding) -> int:
    """Draft tokens a round may verify before the sequence reaches the window (a round emits at
    most one more than it drafts); unbounded without a shift, whose budget the window capped."""
    if loop.request.shift is None:
        return loop.max_tokens
    return loop.engine.context_length - len(d.history) - 1


def due(loop: RoundLoop, d: _Decoding) -> bool:
    return loop.request.shift is not None and len(d.history) >= loop.engine.context_length


def shift(loop: RoundLoop, d: _Decoding, pause: Any) -> Generator[Any, None, bool]:
    """Drop the planned span from the sequence, cut the cache back to the kept head and feed the
    moved tail again (yielding `pause` between chunks under a scheduler); the drafter restarts on
    the shifted sequence. False if the request was cancelled meanwhile."""
    assert loop.request.shift is not None
    keep, discard = loop.request.shift.plan(len(d.history), len(loop.prompt), loop.engine.context_length)
    del d.history[keep : keep + discard]
    d.decider.prompt_len -= discard  # tokens generated so far stay counted (min_tokens, sampling keys)
    d.shadow = []
    cache = d.cache
    kept = cache.reuse_prefix(d.history)
    for fed in cache.prefill_steps(d.history[kept:-1], stop=loop.request.cancelled):
        if not fed:
            loop.finish_reason = "cancelled"
            return False
        if loop.gate is not None:
            yield pause  # other sequences decode between this sequence's chunks
    if d.drafter is not None:
        d.drafter.begin(d.history, cache)
    loop.stats.context_shifts += 1
    return True

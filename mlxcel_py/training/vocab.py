"""The draft vocabulary: the target tokens the drafter may propose, the ones its answers use most.

A drafter's output layer costs (draft vocabulary x hidden) multiply-adds a step, every step, so a
smaller vocabulary drafts faster; a token outside it is never proposed (its positions cost
acceptance, not exactness). EAGLE-3's checkpoints map draft id d to target id d + d2t[d] and mark
the kept target ids in t2d (vLLM speculators' layout); ids are kept in target order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


def choose(counts: Counter, size: int, vocab_size: int) -> list[int]:
    """The `size` most frequent target ids (ties by id), topped up with the lowest unused ids when
    the answers use fewer; sorted."""
    size = min(size, vocab_size)
    picked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if 0 <= t < vocab_size][:size]
    have = set(picked)
    spare = (t for t in range(vocab_size) if t not in have)
    while len(picked) < size:
        picked.append(next(spare))
    return sorted(picked)


def count(samples: Iterable[tuple[Sequence[int], int]]) -> Counter:
    """Answer tokens of (tokens or labels, prompt_len) samples."""
    c: Counter = Counter()
    for tokens, prompt_len in samples:
        c.update(tokens[prompt_len:])
    return c


def coverage(counts: Counter, ids: Sequence[int]) -> float:
    kept = set(ids)
    total = sum(counts.values())
    return sum(n for t, n in counts.items() if t in kept) / total if total else 0.0

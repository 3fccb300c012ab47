"""Finished sequences' caches, kept for the requests that follow (a bounded LRU; `serve --cache-ram`).

A chat client resends its whole history every turn, and many requests open with the same system
prompt. When a request ends, its SequenceCache (layers plus the token ids they hold) goes back in
the pool as the most recently used entry; a new request takes the entry sharing the longest
prefix with its prompt, and `SequenceCache.reuse_prefix` trims it to that prefix (trim, window
slice, or a reset where a cache kind cannot drop positions without a checkpoint: a hybrid model's
entry is reused only when the new prompt extends it). Only whole requests are stored, so an entry
is always at a request boundary. An entry is owned by one request at a time (taken out of the
pool), so concurrent requests never share layers. Past the byte budget the least recently used
entries go first; an entry larger than the whole budget is not kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .cache import SequenceCache, _arrays


def cache_bytes(cache: SequenceCache) -> int:
    """Memory the layers hold: each layer cache's allocated buffers (mlx-lm's `nbytes`: a KV
    cache grows 256 positions at a time, past the filled part), its state's arrays where a cache
    kind does not say."""
    total = 0
    for c in cache.layers:
        try:
            total += c.nbytes
        except (AttributeError, NotImplementedError):
            total += sum(a.nbytes for a in _arrays(c.state))
    return total


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


@dataclass
class Stats:
    hits: int = 0  # requests that started from a stored entry
    misses: int = 0
    reused_tokens: int = 0
    evicted: int = 0


class PromptCache:
    def __init__(self, new: Callable[[], SequenceCache], budget_bytes: int | None):
        """`new` makes an empty SequenceCache; `budget_bytes` None is no limit."""
        self._new = new
        self.budget = budget_bytes
        self._entries: list[tuple[SequenceCache, int]] = []  # (cache, bytes), least recently used first
        self._lock = threading.Lock()
        self.stats = Stats()

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return sum(b for _, b in self._entries)

    def take(self, prompt: Sequence[int]) -> SequenceCache:
        """The stored cache sharing the longest prefix with `prompt` (out of the pool), or a new one."""
        with self._lock:
            best, best_n = -1, 0
            for i, (c, _) in enumerate(self._entries):
                n = common_prefix(c.tokens, prompt)
                if n > best_n:
                    best, best_n = i, n
            if best < 0:
                self.stats.misses += 1
                return self._new()
            cache, _ = self._entries.pop(best)
            self.stats.hits += 1
            self.stats.reused_tokens += min(best_n, len(prompt) - 1)
            return cache

    def give(self, cache: SequenceCache) -> None:
        """A finished request's cache back in as the most recent entry; evict past the budget."""
        if not cache.tokens:
            return
        size = cache_bytes(cache)
        with self._lock:
            if self.budget is not None and size > self.budget:
                self.stats.evicted += 1
                return
            # an entry whose tokens are a prefix of this one's holds nothing this one lacks
            kept = [(c, b) for c, b in self._entries if common_prefix(c.tokens, cache.tokens) < len(c.tokens)]
            self.stats.evicted += len(self._entries) - len(kept)
            kept.append((cache, size))
            while self.budget is not None and sum(b for _, b in kept) > self.budget:
                kept.pop(0)
                self.stats.evicted += 1
            self._entries = kept

    def take_latest(self) -> SequenceCache | None:
        """The most recently given entry, out of the pool (a slot file is written from it), or None."""
        with self._lock:
            return self._entries.pop()[0] if self._entries else None

    def clear(self) -> int:
        """Drop every entry; the tokens they held."""
        with self._lock:
            dropped = sum(len(c.tokens) for c, _ in self._entries)
            self._entries = []
            return dropped

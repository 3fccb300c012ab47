"""KV caches for one sequence: creation, exact rollback, and prefix reuse across requests.

Rollback goes through mlx-lm's own `trim` (an offset change, O(1)); a trim that removes fewer
tokens than asked is a bug, not a user error, so it asserts. `SequenceCache` also remembers which
tokens the cache holds, so a chat turn can reuse the longest common prefix of the last turn.
"""

from __future__ import annotations

from typing import Any, Sequence

from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache


def rollback(caches: list[Any], n: int) -> None:
    """Drop the newest `n` positions from every layer cache."""
    if n <= 0:
        return
    trimmed = trim_prompt_cache(caches, n)
    assert trimmed == n, f"cache rollback trimmed {trimmed} of {n} tokens"


def offset(caches: list[Any]) -> int:
    return caches[0].offset if caches else 0


class SequenceCache:
    """A model's layer caches plus the token ids they hold, in order."""

    def __init__(self, model: Any):
        self.model = model
        self.layers = make_prompt_cache(model)
        self.tokens: list[int] = []

    @property
    def trimmable(self) -> bool:
        return can_trim_prompt_cache(self.layers)

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens."""
        drop = len(self.tokens) - n
        if drop > 0:
            rollback(self.layers, drop)
            del self.tokens[n:]

    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Trim to the longest common prefix with `tokens` (at most len-1); return its length."""
        limit = min(len(self.tokens), len(tokens) - 1)
        n = 0
        while n < limit and self.tokens[n] == tokens[n]:
            n += 1
        if not self.trimmable and n < len(self.tokens):
            self.layers = make_prompt_cache(self.model)
            self.tokens = []
            return 0
        self.truncate(n)
        return n

    def appended(self, tokens: Sequence[int]) -> None:
        """Record that `tokens` were just fed through the model with these caches."""
        self.tokens.extend(tokens)

"""`--verify-exact`: locate the first token where a speculative run left the plain token stream.

At temperature 0 a verify block and single-token forwards can reduce in a different order, so a
near-tie can flip. This reruns the shared prefix both ways (single-token step and a verify-shaped
block) and reports the top-2 logit margins at the first divergence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .cache import SequenceCache

BLOCK = 8


@dataclass(frozen=True)
class Divergence:
    index: int
    speculative_token: int | None
    plain_token: int | None
    step_margin: float  # logit[plain] - logit[spec] from a single-token forward
    block_margin: float  # the same from a verify-shaped block forward

    def describe(self, tokenizer) -> str:
        def show(t):
            return "end of output" if t is None else repr(tokenizer.decode([t]))

        return (
            f"[verify-exact] first difference at generated token {self.index}: speculative {show(self.speculative_token)}, "
            f"plain {show(self.plain_token)}; logit margin plain-vs-speculative: single-token step {self.step_margin:+.5f}, "
            f"verify block {self.block_margin:+.5f} (a near-tie, not a rollback bug, when both are small)"
        )


def _margin(logits: mx.array, a: int | None, b: int | None) -> float:
    row = logits.astype(mx.float32)
    if a is None or b is None:
        top = mx.sort(row)[-2:].tolist()
        return float(top[1] - top[0])
    return float((row[a] - row[b]).item())


def first_divergence(model: Any, prompt: Sequence[int], spec: Sequence[int], plain: Sequence[int]) -> Divergence | None:
    n = 0
    while n < len(spec) and n < len(plain) and spec[n] == plain[n]:
        n += 1
    if n == len(spec) and n == len(plain):
        return None
    a = plain[n] if n < len(plain) else None
    b = spec[n] if n < len(spec) else None
    context = list(prompt) + list(spec[:n])
    step_cache = SequenceCache(model)
    step_cache.feed(context[:-1])
    step = step_cache.feed(context[-1:])[-1]
    block_cache = SequenceCache(model)
    width = min(BLOCK, len(context) - 1)
    block_cache.feed(context[:-width])
    block = block_cache.feed(context[-width:])[-1]
    return Divergence(n, b, a, _margin(step, a, b), _margin(block, a, b))

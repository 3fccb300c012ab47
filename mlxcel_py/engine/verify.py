"""One verify round, shared by every drafter and by the offline and server paths.

Feed `[last, d1..dk]` in one forward, decide each position with the request's Decider, keep the
longest accepted prefix plus the target's own next token (the replacement at the first rejection,
or a bonus token after a full block), and roll the cache back by exactly the rejected count
(`SequenceCache.truncate`, which picks trim, window slice or checkpoint replay per cache kind).
Rules: sampler-match for one-hot drafts (prompt lookup, argmax drafters): accept d_i iff it equals
the target's own draw at that position, which is lossless and, with position-keyed randomness,
reproduces the plain run token for token. Lossless p/q (Leviathan/Chen) for drafters that sampled
from a distribution q: accept with probability min(1, p/q), else draw from norm(max(0, p - q)).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from .cache import SequenceCache
from .sampling import Decider
from .tree import DraftTree

RULE_GREEDY = "greedy-argmax"
RULE_SAMPLER_MATCH = "sampler-match"
RULE_PQ = "lossless-p/q"


@dataclass(frozen=True)
class Verdict:
    accepted: int
    tokens: list[int]  # draft[:accepted] + [the target's own token]
    rule: str
    rollback_s: float = 0.0
    rows: mx.array | None = None  # the target's logits that chose each of `tokens` (for logprobs)


def judge(
    cache: SequenceCache,
    history: Sequence[int],
    draft: Sequence[int],
    decider: Decider,
    q: mx.array | None,
    logits: mx.array,
) -> Verdict:
    """The second half of a round: `logits` are the rows of `[last, *draft]` just fed to `cache`
    after `cache.mark()` (by the round loop, or by a scheduler's batched forward); decide,
    accept, roll back."""
    inputs = [history[-1], *draft]
    if q is not None and not decider.greedy:
        accepted, token = _accept_pq(logits, history, inputs, draft, decider, q)
        rule = RULE_PQ
    else:
        targets = decider.decide(logits, history, inputs)
        accepted = 0
        while accepted < len(draft) and draft[accepted] == targets[accepted]:
            accepted += 1
        token = targets[accepted]
        rule = RULE_GREEDY if decider.greedy else RULE_SAMPLER_MATCH
    # the cache now holds last + all drafts; keep last + the accepted ones
    t = time.perf_counter()
    rolled = cache.truncate(len(cache.tokens) - (len(draft) - accepted))
    cache.release()
    assert rolled, "a verify round always has a checkpoint to roll back to"
    return Verdict(accepted, list(draft[:accepted]) + [token], rule, time.perf_counter() - t, logits[: accepted + 1])


def judge_tree(
    cache: SequenceCache, history: Sequence[int], tree: DraftTree, decider: Decider, logits: mx.array
) -> Verdict:
    """`judge` for a draft tree (engine/tree.py): `logits` are the rows of `[last, *tree.tokens]`
    just fed to `cache` as a tree. Keeps the longest root-to-node path of the target's own greedy
    choices and the target's token after it; the cache keeps the root and the path's rows, moved
    to consecutive positions (SequenceCache.keep_rows), as a chain of those tokens leaves it.

    Greedy only: each row is decided as plain decoding decides the token after its own path
    (logit bias, repetition penalty over the path's history, EOS masking by its depth)."""
    if not decider.greedy:
        raise ValueError("a draft tree is verified greedily only (sampled requests draft chains)")
    if decider.has_processors:  # a row's processors read its own path, not the rows before it

        def choose(row: int, path: list[int]) -> int:
            return decider.decide(logits[row : row + 1], [*history, *path], [history[-1]])[0]

    else:
        choices = decider.decide(logits, history, [history[-1], *tree.tokens])

        def choose(row: int, path: list[int]) -> int:
            return choices[row]

    path, token = tree.walk(choose)
    t = time.perf_counter()
    first = len(cache.tokens) - len(tree)  # the row after the root
    cache.keep_rows(first, [first + n for n in path])
    rows = logits[mx.array([0, *(n + 1 for n in path)], dtype=mx.int32)]
    return Verdict(len(path), [tree.tokens[n] for n in path] + [token], RULE_GREEDY, time.perf_counter() - t, rows)


def _accept_pq(logits, history, inputs, draft, decider: Decider, q: mx.array) -> tuple[int, int]:
    k = len(draft)
    rows = decider.processed_rows(logits, history, inputs)
    p = decider.probs(rows)  # (k+1, V)
    start = len(history) - decider.prompt_len
    d = mx.array(list(draft), dtype=mx.int32)
    p_d = mx.take_along_axis(p[:k], d[:, None], axis=-1)[:, 0]
    q_d = mx.take_along_axis(q, d[:, None], axis=-1)[:, 0]
    u = mx.stack([mx.random.uniform(key=decider.key(start + i, salt=1)) for i in range(k)])
    # accept iff u * q(d) < p(d)  <=>  u < min(1, p/q), without dividing by a zero q
    ok = (u * q_d < p_d).tolist()
    accepted = 0
    while accepted < k and ok[accepted]:
        accepted += 1
    index = start + accepted
    if accepted == k:  # bonus token: an ordinary draw from p, the same one plain sampling makes
        lp = mx.log(p[k])
        return accepted, mx.random.categorical(lp, key=decider.key(index)).item()
    residual = mx.maximum(p[accepted] - q[accepted], 0.0)
    total = residual.sum()
    # p == q at this row leaves no residual mass; then any draw from p is exact
    dist = mx.where(total > 0, residual / mx.maximum(total, 1e-30), p[accepted])
    token = mx.random.categorical(mx.log(dist), key=decider.key(index, salt=2)).item()
    return accepted, token

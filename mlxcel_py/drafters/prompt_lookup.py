"""Prompt-lookup drafter: propose the continuation of the latest earlier match of the context suffix.

The index is pure Python over token ids (no MLX). Matching follows mlxcel: suffix n-grams from ngram_max down
to ngram_min, the most recent earlier occurrence that has at least one follower, never the suffix
itself; up to `limit` followers, capped at the end of the context. An incremental index (one dict
per n, n-gram -> latest start with a follower) answers like a rescan at O(1) per new token.

Short fallback (ours, on by default): when no n-gram of ngram_min or more matches, the newest
token alone is looked up and up to FALLBACK of its last occurrence's followers are proposed (match
length 1, so the cost policy weighs them in their own bucket). Why: after the model departs from
its source for a word ("honking" -> "honkey"), mlxcel's drafter finds no 2-gram and decodes
plainly until the reply is back on a known pair, though the next token ("great") already says
where; and on a CPU a verify of 2-3 rows costs about a plain step, so a short guess costs little
when wrong. A whole-width 1-gram draft (`--prompt-lookup-ngram-min 1`) costs more, and slowed
prose. Public workload, one interleaved A/B of 4 runs: median speedup over plain 1.71x -> 1.87x
(edit 1.95x -> 2.28x, reformat 2.25x -> 2.53x, prose 1.27x -> 1.35x, code unchanged); fallbacks
of 1 and 3 tokens did less. MLXCEL_LOOKUP_FALLBACK=N sets it (0: mlxcel's drafter exactly).

Trees (`find_tree`, engine/tree.py): the chain above first, then the continuations of the other
recent occurrences (of the longest matching n-gram first, then of shorter ones) where they differ
from it, merged into one tree: a text that repeats a phrase with several endings offers each.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..engine.tree import DraftTree, merge
from ..errors import UsageError
from ..inputs.digits import whole_number
from .base import Drafter, DrafterSource, Plan, Proposal, stop_at_eos

MATCH_CAP = 8  # how far back find_match measures a match (the cost policy buckets at 5+)
FALLBACK = 2  # followers of the newest token alone proposed when no n-gram matches (see above)
TREE_MATCHES = 8  # recent occurrences of an n-gram whose continuations a tree offers


class PromptLookupIndex:
    def __init__(self, ngram_min: int = 2, ngram_max: int = 3, fallback: int = 0):
        if ngram_min < 1 or ngram_max < ngram_min or fallback < 0:
            raise ValueError(f"bad n-gram range {ngram_min}..{ngram_max} or fallback {fallback}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.fallback = fallback if ngram_min > 1 else 0  # with ngram_min 1 the 1-gram is a match anyway
        self.tokens: list[int] = []
        low = 1 if self.fallback else ngram_min
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(low, ngram_max + 1)}
        # n -> n-gram -> the starts before its latest one (newest last, at most TREE_MATCHES - 1)
        self._earlier: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self._latest}

    def reset(self, tokens: Sequence[int]) -> None:
        self.tokens = []
        for table in (*self._latest.values(), *self._earlier.values()):
            table.clear()
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        toks = self.tokens
        for t in tokens:
            i = len(toks)  # position of the new token: it becomes the follower of n-grams ending at i-1
            toks.append(t)
            for n, table in self._latest.items():
                if i >= n:
                    gram = tuple(toks[i - n : i])
                    prev = table.get(gram)
                    if prev is not None:
                        older = self._earlier[n].setdefault(gram, [])
                        older.append(prev)
                        if len(older) >= TREE_MATCHES:
                            del older[0]
                    table[gram] = i - n

    def find(self, limit: int) -> list[int]:
        """Followers of the latest earlier occurrence of the longest matching suffix (<= limit)."""
        return self.find_match(limit)[0]

    def find_match(self, limit: int, *, periodic: bool = False, fallback: bool = True) -> tuple[list[int], int]:
        """`find`, plus how far the match really reaches back (n extended while the tokens before
        both occurrences agree, up to MATCH_CAP): a long match is a confident one.

        periodic=True (the cost policy's drafting): when the followers run into the end of the
        context, keep proposing as if the text repeats with the period the match implies, so a
        reply caught in a loop is drafted `limit` tokens at a time instead of one period.
        fallback=False: no short 1-gram proposal when nothing longer matches."""
        toks = self.tokens
        size = len(toks)
        if limit <= 0:
            return [], 0
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            start = self._latest[n].get(tuple(toks[size - n :]))
            if start is not None:
                begin = start + n
                length = n
                while (
                    length < MATCH_CAP
                    and start - 1 - (length - n) >= 0
                    and toks[start - 1 - (length - n)] == toks[size - 1 - length]
                ):
                    length += 1
                out = toks[begin : min(begin + limit, size)]
                if periodic:
                    period = size - begin
                    while len(out) < limit:
                        out.append(out[len(out) - period])
                return out, length
        if fallback and self.fallback and size > 1:
            start = self._latest[1].get((toks[-1],))
            if start is not None:
                return toks[start + 1 : min(start + 1 + min(limit, self.fallback), size)], 1
        return [], 0

    def find_tree(self, limit: int, *, periodic: bool = False) -> tuple[list[int], int, DraftTree | None]:
        """`find_match`'s chain and match length, and a tree: that chain first, then the
        continuations (up to `limit` tokens) of the other recent occurrences of each matching
        suffix n-gram, longest n first, newest first (for the short fallback's chain: the newest
        token's other occurrences, as short). None when no other occurrence differs."""
        chain, length = self.find_match(limit, periodic=periodic)
        if not chain:
            return chain, length, None
        toks = self.tokens
        size = len(toks)
        branches = [chain]
        seen: set[int] = set()
        low, cap = self.ngram_min, limit
        if self.fallback and length == 1:  # nothing longer matched (find_match)
            low, cap = 1, min(limit, self.fallback)
        for n in range(min(self.ngram_max, size - 1), low - 1, -1):
            gram = tuple(toks[size - n :])
            latest = self._latest[n].get(gram)
            if latest is None:
                continue
            for start in [latest, *reversed(self._earlier[n].get(gram, []))]:
                begin = start + n
                if begin in seen:
                    continue
                seen.add(begin)
                branches.append(toks[begin : min(begin + cap, size)])
        tree = merge(branches)
        return chain, length, (None if tree.is_chain else tree)


def find_by_scan(tokens: Sequence[int], ngram_min: int, ngram_max: int, limit: int) -> list[int]:
    """Reference implementation (a rescan) that the index must agree with; used by tests."""
    size = len(tokens)
    if limit <= 0:
        return []
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        suffix = list(tokens[size - n :])
        for start in range(size - n - 1, -1, -1):  # start + n < size: at least one follower
            if list(tokens[start : start + n]) == suffix:
                return list(tokens[start + n : min(start + n + limit, size)])
    return []


class PromptLookupDrafter(Drafter):
    """N-gram lookup over prompt + generated text (one-hot proposals)."""

    kind = "prompt-lookup"

    def __init__(
        self,
        ngram_min: int = 2,
        ngram_max: int = 3,
        eos_ids: Sequence[int] = (),
        *,
        periodic: bool = False,
        fallback: int = FALLBACK,
    ):
        self.index = PromptLookupIndex(ngram_min, ngram_max, fallback)
        self.eos_ids = frozenset(eos_ids)
        self.periodic = periodic  # see PromptLookupIndex.find_match

    def begin(self, context: Sequence[int], target: Any = None) -> None:
        self.index.reset(context)

    def commit(self, context: Sequence[int]) -> None:
        self.index.extend(context[len(self.index.tokens) :])

    def propose(self, context: Sequence[int], limit: int, decider, *, fallback: bool = True) -> Proposal:
        """`fallback=False`: only a real n-gram match drafts (the composite drafter's test)."""
        self.commit(context)
        tokens, match_len = self.index.find_match(limit, periodic=self.periodic, fallback=fallback)
        return Proposal(stop_at_eos(tokens, self.eos_ids, decider), match_len=match_len)

    def propose_tree(self, context: Sequence[int], limit: int, decider, nodes: int) -> Proposal:
        self.commit(context)
        tokens, match_len, tree = self.index.find_tree(limit, periodic=self.periodic)
        tokens = stop_at_eos(tokens, self.eos_ids, decider)
        if tree is not None:
            tree = tree.ended(lambda t: t in self.eos_ids and not decider.ignore_eos)
        return Proposal(tokens, match_len=match_len, tree=tree)

    def shadow(self, limit: int) -> list[int]:
        # the gated policy resumes when a shadow comes true: only a real n-gram match is evidence
        return self.index.find_match(limit, fallback=False)[0]


class Source(DrafterSource):
    def new_drafter(self) -> PromptLookupDrafter:
        return drafter_for(self.config.lookup, self.eos_ids)


def drafter_for(lk: Any, eos_ids: Sequence[int]) -> PromptLookupDrafter:
    """The drafter a LookupConfig asks for (prompt lookup alone, or a composite's lookup side)."""
    # mlxcel's policies keep its drafter exactly (followers end at the context's end);
    # our cost policy also drafts through loops, since it sizes every proposal itself
    return PromptLookupDrafter(
        lk.ngram_min,
        lk.ngram_max,
        eos_ids,
        periodic=lk.adaptive and lk.policy == "cost",
        fallback=fallback_length(),
    )


def fallback_length() -> int:
    """FALLBACK, or MLXCEL_LOOKUP_FALLBACK (A/B runs; 0 is mlxcel's drafter exactly)."""
    raw = os.environ.get("MLXCEL_LOOKUP_FALLBACK", "").strip()
    if not raw:
        return FALLBACK
    if not whole_number(raw):
        raise UsageError(f"MLXCEL_LOOKUP_FALLBACK must be a whole number of tokens (0 turns it off), got {raw!r}")
    return int(raw)


def prepare(draft, target, model_options) -> Plan:
    """Nothing to load: the drafter reads the context only (MLXCEL_LOOKUP_FALLBACK is checked
    here, before any weights load)."""
    fallback_length()
    return Plan(
        draft,
        lambda loaded, say: Source.of(draft, loaded),
    )

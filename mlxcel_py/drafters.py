"""Drafters: where proposals come from. Each returns token ids (and q rows when it sampled).

- PromptLookupDrafter: n-gram lookup over prompt + generated text (one-hot proposals).
- FullModelDrafter: a smaller causal LM sharing the target's tokenizer, run autoregressively from
  its own caches; argmax drafts when greedy, samples from its filtered distribution q otherwise
  (then the verifier applies the lossless p/q rule). Rejected drafts leave its cache through the
  same rollback the target uses (SequenceCache.truncate: trim, window slice or checkpoint replay).
The engine calls begin() once per request, propose() before a round, commit() after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import mlx.core as mx

from .cache import SequenceCache
from .prompt_lookup import PromptLookupIndex
from .sampling import Decider


@dataclass
class Proposal:
    tokens: list[int]
    q: mx.array | None = None  # (len(tokens), V) proposal distribution, None for one-hot drafts
    match_len: int | None = None  # prompt lookup: how long the matched context is (confidence)


class Drafter(Protocol):
    kind: str

    def begin(self, context: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], limit: int, decider: Decider) -> Proposal: ...

    def commit(self, context: Sequence[int]) -> None: ...

    def shadow(self, limit: int) -> list[int]: ...


class PromptLookupDrafter:
    kind = "prompt-lookup"

    def __init__(self, ngram_min: int, ngram_max: int, eos_ids: Sequence[int] = (), *, periodic: bool = False):
        self.index = PromptLookupIndex(ngram_min, ngram_max)
        self.eos_ids = frozenset(eos_ids)
        self.periodic = periodic  # see PromptLookupIndex.find_match

    def begin(self, context: Sequence[int]) -> None:
        self.index.reset(context)

    def commit(self, context: Sequence[int]) -> None:
        self.index.extend(context[len(self.index.tokens) :])

    def propose(self, context: Sequence[int], limit: int, decider: Decider) -> Proposal:
        self.commit(context)
        tokens, match_len = self.index.find_match(limit, periodic=self.periodic)
        if self.eos_ids and not decider.ignore_eos:
            # output ends at EOS, so drafting past one only widens the verify block for nothing
            for i, t in enumerate(tokens):
                if t in self.eos_ids:
                    tokens = tokens[: i + 1]
                    break
        return Proposal(tokens, match_len=match_len)

    def shadow(self, limit: int) -> list[int]:
        return self.index.find(limit)


class FullModelDrafter:
    kind = "full-model"

    def __init__(self, model: Any, target_vocab: int | None = None):
        self.model = model
        self.cache = SequenceCache(model)
        self.target_vocab = target_vocab

    def begin(self, context: Sequence[int]) -> None:
        n = self.cache.reuse_prefix(context)
        self.cache.prefill(list(context[n:-1]))

    def commit(self, context: Sequence[int]) -> None:
        pass  # propose() trims to the common prefix with the committed context

    def shadow(self, limit: int) -> list[int]:
        return []

    def propose(self, context: Sequence[int], limit: int, decider: Decider) -> Proposal:
        n = self.cache.reuse_prefix(context)  # drops the rejected drafts (see SequenceCache.truncate)
        feed = list(context[n:])
        self.cache.mark()  # the next propose rolls back to the committed context from here
        x = mx.array(feed, dtype=mx.int32)
        picks: list[mx.array] = []
        rows: list[mx.array] = []
        start = len(context) - decider.prompt_len
        # The chain stays lazy: each step's input is the previous step's (unevaluated) pick,
        # so k draft steps cost one synchronisation instead of k.
        for i in range(limit):
            logits = self.cache.run(x)[-1:].astype(mx.float32)
            if decider.greedy:
                t = mx.argmax(logits, axis=-1)
            else:
                q = decider.probs(logits)
                rows.append(q)
                t = mx.random.categorical(mx.log(q), key=decider.key(start + i, salt=3))
            picks.append(t)
            x = t.astype(mx.int32)
        tokens_arr = mx.concatenate(picks)
        q_all = mx.concatenate(rows, axis=0) if rows else None
        if q_all is not None and self.target_vocab and q_all.shape[-1] < self.target_vocab:
            q_all = mx.pad(q_all, [(0, 0), (0, self.target_vocab - q_all.shape[-1])])
        mx.eval(tokens_arr, *( [q_all] if q_all is not None else []))
        tokens = tokens_arr.tolist()
        self.cache.appended(feed + tokens[:-1])
        return Proposal(tokens, q_all)

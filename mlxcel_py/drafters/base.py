"""Drafters: where proposals come from. Each returns token ids (and q rows when it sampled).

- PromptLookupDrafter: n-gram lookup over prompt + generated text (one-hot proposals).
- MTPDrafter (mtp.py): a Qwen3.5 / Qwen3-Next checkpoint's own multi-token-prediction head;
  AssistantDrafter (gemma4_assistant.py): Gemma 4's assistant checkpoint. Both run as "mtp".
- SuffixDrafter (suffix.py): the context and a store of earlier sequences (SuffixDecoding).
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

from ..engine.cache import SequenceCache
from .prompt_lookup_index import PromptLookupIndex
from ..engine.sampling import Decider


@dataclass
class Proposal:
    tokens: list[int]
    q: mx.array | None = None  # (len(tokens), V) proposal distribution, None for one-hot drafts
    match_len: int | None = None  # prompt lookup: how long the matched context is (confidence)


def stop_at_eos(tokens: list[int], eos_ids: frozenset[int], decider: Decider) -> list[int]:
    """Output ends at EOS, so drafting past one only widens the verify block for nothing."""
    if eos_ids and not decider.ignore_eos:
        for i, t in enumerate(tokens):
            if t in eos_ids:
                return tokens[: i + 1]
    return tokens


def draw(logits: mx.array, decider: Decider, index: int) -> tuple[mx.array, mx.array | None]:
    """A model drafter's pick from one logits row (1, V): argmax when greedy, else a sample from
    the filtered distribution q (returned, for the lossless p/q rule). Stays lazy."""
    if decider.greedy:
        return mx.argmax(logits, axis=-1), None
    q = decider.probs(logits)
    return mx.random.categorical(mx.log(q), key=decider.key(index, salt=3)), q


def chain_proposal(picks: list[mx.array], rows: list[mx.array], target_vocab: int | None) -> Proposal:
    """Evaluate a lazy draft chain once: its tokens, and q (padded to the target's vocabulary)."""
    tokens = mx.concatenate(picks)
    q = mx.concatenate(rows, axis=0) if rows else None
    if q is not None and target_vocab and q.shape[-1] < target_vocab:
        q = mx.pad(q, [(0, 0), (0, target_vocab - q.shape[-1])])
    mx.eval(tokens, *([q] if q is not None else []))
    return Proposal(tokens.tolist(), q)


class Drafter(Protocol):
    kind: str

    def begin(self, context: Sequence[int], target: SequenceCache | None = None) -> None: ...

    def propose(self, context: Sequence[int], limit: int, decider: Decider) -> Proposal: ...

    def commit(self, context: Sequence[int]) -> None: ...

    def shadow(self, limit: int) -> list[int]: ...


class PromptLookupDrafter:
    kind = "prompt-lookup"

    def __init__(self, ngram_min: int, ngram_max: int, eos_ids: Sequence[int] = (), *, periodic: bool = False):
        self.index = PromptLookupIndex(ngram_min, ngram_max)
        self.eos_ids = frozenset(eos_ids)
        self.periodic = periodic  # see PromptLookupIndex.find_match

    def begin(self, context: Sequence[int], target: SequenceCache | None = None) -> None:
        self.index.reset(context)

    def commit(self, context: Sequence[int]) -> None:
        self.index.extend(context[len(self.index.tokens) :])

    def propose(self, context: Sequence[int], limit: int, decider: Decider) -> Proposal:
        self.commit(context)
        tokens, match_len = self.index.find_match(limit, periodic=self.periodic)
        return Proposal(stop_at_eos(tokens, self.eos_ids, decider), match_len=match_len)

    def shadow(self, limit: int) -> list[int]:
        return self.index.find(limit)


class FullModelDrafter:
    kind = "full-model"

    def __init__(self, model: Any, target_vocab: int | None = None):
        self.model = model
        self.cache = SequenceCache(model)
        self.target_vocab = target_vocab

    def begin(self, context: Sequence[int], target: SequenceCache | None = None) -> None:
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
            t, q = draw(logits, decider, start + i)
            rows += [q] if q is not None else []
            picks.append(t)
            x = t.astype(mx.int32)
        proposal = chain_proposal(picks, rows, self.target_vocab)
        self.cache.appended(feed + proposal.tokens[:-1])
        return proposal

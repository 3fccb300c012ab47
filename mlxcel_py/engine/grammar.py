"""Constrained decoding: a grammar over the output's token ids, kept in step with what is committed.

The grammar engine is llguidance (JSON schema, Lark, llama.cpp's GBNF, regex), chosen because its
matcher validates a draft, rolls back and computes a 49k-token mask in tens of microseconds on this
CPU (docs/bench/grammar.md). A `Constraint` is one request's matcher over the output committed so
far; the round loop uses it three ways, so speculation stays on under a grammar:

- a proposal is cut at the first token the grammar rejects (`admissible`), since the target would
  never choose it;
- every row of a verify block is masked by the grammar state after the row's prefix (`mask_rows`:
  row r follows the block's first r drafts), so each row chooses exactly what plain constrained
  decoding would there, and a plain step is masked by the current state;
- the committed tokens advance the matcher (`commit`); drafts beyond them were only looked at, so
  nothing needs rolling back, and a grammar that is complete ends the output (`finished`).

Greedy output under a grammar is therefore plain constrained decoding's token for token; sampling
draws from the masked distribution p (the lossless rule compares it with the drafter's q, and a cut
draft never holds a token whose p is 0).

Compiling needs the tokenizer's byte-level view (`TokenizerIndex`, built once per tokenizer, about
half a second); checking a grammar's text (mlxcel_py/formats/grammars.py) needs nothing, so validation
refuses a bad one before any model loads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..formats.grammars import GrammarError, GrammarSpec, compiled, native

__all__ = ["Constraint", "GrammarError", "GrammarSpec", "TokenizerIndex"]


class TokenizerIndex:
    """llguidance's view of one tokenizer (every token's bytes), built once and shared."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]):
        import llguidance.hf

        self.vocab_size = vocab_size
        eos = list(eos_ids)
        try:
            self.ll = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos or None)
        except Exception as exc:  # a slow (Python) tokenizer, or one llguidance cannot read
            raise GrammarError(f"this model's tokenizer cannot drive a grammar: {exc}") from None

    @classmethod
    def of(cls, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> TokenizerIndex:
        """The index of a loaded tokenizer (mlx-lm's wrapper or a Hugging Face fast tokenizer),
        made once per tokenizer and vocabulary size and kept on the tokenizer (an id()-keyed table
        would hand a freed tokenizer's index to a new one at the same address)."""
        made = getattr(tokenizer, "_mlxcel_grammar_index", None)
        if made is None or made.vocab_size != vocab_size:
            made = cls(getattr(tokenizer, "_tokenizer", tokenizer), vocab_size, eos_ids)
            tokenizer._mlxcel_grammar_index = made
        return made

    def compile(self, spec: GrammarSpec) -> Constraint:
        """The request's matcher; GrammarError for a grammar over a limit or that does not compile.
        Both llguidance calls run on formats.grammars' big-stack thread, within its time budget."""
        import llguidance

        grammar = compiled(spec)
        matcher = native(llguidance.LLMatcher, self.ll, grammar, what=f"the {spec.describe()}")
        if matcher.is_error():
            raise GrammarError(f"the {spec.describe()} does not compile: {str(matcher.get_error()).strip()}")
        return Constraint(matcher, self.vocab_size, spec)


class OutputRule(Protocol):
    """What the round loop asks of a rule on the output's tokens: a grammar (Constraint) or a
    thinking budget (engine/thinking_budget.py)."""

    def admissible(self, tokens: Sequence[int]) -> int: ...  # how many of them it accepts in a row
    def mask_rows(self, logits: Any, drafts: Sequence[int] = ()) -> Any: ...  # row r after drafts[:r]
    def commit(self, tokens: Sequence[int]) -> None: ...

    @property
    def finished(self) -> bool: ...  # nothing more may follow


class Constraint:
    """One request's grammar state over its committed output tokens (see the module note)."""

    def __init__(self, matcher: Any, vocab_size: int, spec: GrammarSpec):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.spec = spec
        self._words = (vocab_size + 31) // 32
        self.mask_s = 0.0  # time spent computing masks (stats)

    def _mask(self) -> np.ndarray:
        t = time.perf_counter()
        words = np.zeros(self._words, dtype=np.int32)
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size].astype(bool)
        self.mask_s += time.perf_counter() - t
        return bits

    def admissible(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the current state, the grammar accepts in a row."""
        return int(self.matcher.validate_tokens(list(tokens))) if tokens else 0

    def mask_rows(self, logits: Any, drafts: Sequence[int] = ()) -> Any:
        """Logits rows (len(drafts)+1, V) with every token the grammar forbids at -inf: row r
        under the state after drafts[:r] (which must be admissible)."""
        masks = []
        consumed = 0
        try:
            for r in range(len(drafts) + 1):
                masks.append(self._mask())
                if r < len(drafts):
                    if not self.matcher.consume_token(int(drafts[r])):
                        raise RuntimeError(f"draft token {drafts[r]} is not admissible: {self.matcher.get_error()}")
                    consumed += 1
        finally:
            if consumed:
                self.matcher.rollback(consumed)
        import mlx.core as mx

        allowed = mx.array(np.stack(masks))
        V = logits.shape[-1]
        if V > self.vocab_size:  # a padded output layer: the padding is never a token
            allowed = mx.concatenate([allowed, mx.zeros((allowed.shape[0], V - self.vocab_size), dtype=mx.bool_)], 1)
        return mx.where(allowed[:, :V], logits, -mx.inf)

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens just emitted (each one the masked rows allowed)."""
        if tokens and not self.matcher.consume_tokens([int(t) for t in tokens]):
            raise RuntimeError(f"the grammar refused committed tokens: {self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar allows nothing more (only the end of the sequence)."""
        return bool(self.matcher.is_stopped())

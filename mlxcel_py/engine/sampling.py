"""Per-request token decisions: logits rows -> tokens, identical for plain steps and verify rows.

A `Decider` is built once per request from SamplingOptions. It applies the logits processors
(logit bias, repetition penalty, EOS masking for --ignore-eos/--min-tokens) at the same positions plain
decoding would, then picks a token per row. Randomness is keyed by the generated-token index
(seed, index), not by a global stream, so a seeded speculative run draws exactly the numbers the
plain run draws at each position: with sampler-match acceptance the outputs are identical.
It also exposes the filtered target distribution p, which lossless p/q acceptance needs, and the
key of each position, which a model drafter draws with under sampler-match (drafters/base.draw).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_repetition_penalty

from ..options import SamplingOptions
from .cache import text_ids

_WHOLE_CONTEXT = 1 << 30
TINY_TOP_P = 1e-6  # below it top-p keeps only the most likely token (unless p_max < 1e-6)


class Decider:
    """Turns target logits into tokens for one request (sampler-match rule)."""

    def __init__(
        self,
        sampling: SamplingOptions,
        *,
        eos_ids: Sequence[int] = (),
        prompt_len: int = 0,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        vocab_size: int | None = None,
        pq_drafts: bool = False,
    ):
        self.sampling = sampling
        # --draft-acceptance p-q: model drafters sample their own q, judged by p/q (drafters/base.draw)
        self.pq_drafts = pq_drafts
        self.greedy = sampling.greedy
        self.prompt_len = prompt_len
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.eos = mx.array(sorted(eos_ids), dtype=mx.int32) if eos_ids else None
        self.vocab_size = vocab_size
        seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(6), "little")
        self.seed = seed
        self._penalty: Callable | None = None
        # tokens the penalty looks back over; only that tail is converted to an array per row
        self._penalty_window = sampling.repeat_last_n if sampling.repeat_last_n > 0 else _WHOLE_CONTEXT
        if sampling.repetition_penalty not in (0.0, 1.0) and sampling.repeat_last_n != 0:
            self._penalty = make_repetition_penalty(sampling.repetition_penalty, self._penalty_window)
        # logit_bias: (token ids, additions); -inf bans a token
        self._bias = None
        if sampling.logit_bias:
            ids, values = zip(*sampling.logit_bias)
            self._bias = (mx.array(ids, dtype=mx.int32), mx.array(values, dtype=mx.float32))
        self._filters: list[Callable[[mx.array], mx.array]] = []
        if 0.0 < sampling.top_p < TINY_TOP_P:
            # the nucleus is the top token alone; mlx-lm's filter would compare against
            # top_p * mass = 0 in float32 and drop every token (NaN draws)
            self._filters.append(lambda x: apply_top_k(x, 1))
        elif 0.0 < sampling.top_p < 1.0:
            self._filters.append(lambda x: apply_top_p(x, sampling.top_p))
        if sampling.min_p > 0.0:
            self._filters.append(lambda x: apply_min_p(x, sampling.min_p))
        if sampling.top_k > 0 and (vocab_size is None or sampling.top_k < vocab_size):
            self._filters.append(lambda x: apply_top_k(x, sampling.top_k))

    # -- processors -------------------------------------------------------------------------
    @property
    def has_processors(self) -> bool:
        return self._penalty is not None or (self.eos is not None and (self.ignore_eos or self.min_tokens > 0))

    def _process(self, logits: mx.array, history: Sequence[int]) -> mx.array:
        """logits: (1, V) for the token that follows `history` (prompt + generated so far)."""
        if self._penalty is not None and history:
            logits = self._penalty(mx.array(text_ids(history[-self._penalty_window :]), dtype=mx.int32), logits)
        generated = len(history) - self.prompt_len
        if self.eos is not None and (self.ignore_eos or generated < self.min_tokens):
            logits = logits.at[:, self.eos].add(-mx.inf)
        return logits

    # -- distributions ----------------------------------------------------------------------
    def filtered_logprobs(self, logits: mx.array) -> mx.array:
        """Sampler's distribution (log space, before temperature), rows independent: (R, V)."""
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        for f in self._filters:
            logprobs = f(logprobs)
        return logprobs

    def probs(self, logits: mx.array) -> mx.array:
        """The filtered, tempered distribution p that sampling draws from: (R, V), float32."""
        lp = self.filtered_logprobs(logits.astype(mx.float32))
        return mx.softmax(self.tempered(lp), axis=-1)

    def tempered(self, lp: mx.array) -> mx.array:
        """Filtered log-probabilities over the temperature. Filtered-out entries stay -inf (with a
        huge temperature 1/temp is 0 in float32, and -inf * 0 would be NaN): a huge temperature
        is then uniform over the tokens the filters kept."""
        return mx.where(lp > -mx.inf, lp * (1.0 / self.sampling.temp), -mx.inf)

    def key(self, index: int, salt: int = 0) -> mx.array:
        """PRNG key of generated-token `index` (salt separates independent uses)."""
        return mx.random.key((self.seed * 1_000_003 + index * 7 + salt) & 0x7FFF_FFFF_FFFF_FFFF)

    # -- decisions --------------------------------------------------------------------------
    def processed_rows(self, logits: mx.array, history: Sequence[int], inputs: Sequence[int]) -> mx.array:
        """Apply processors to each row. Row r follows history + inputs[1:r+1]. The logit bias is
        the same at every position, so it goes on all rows at once, first (as llama.cpp's chain)."""
        if self._bias is not None:
            ids, values = self._bias
            logits = logits.at[:, ids].add(values.astype(logits.dtype))
        if not self.has_processors:
            return logits
        rows = []
        hist = list(history)
        for r in range(logits.shape[0]):
            if r > 0:
                hist.append(inputs[r])
            rows.append(self._process(logits[r : r + 1], hist))
        return mx.concatenate(rows, axis=0)

    def sampled_logprobs(self, logits: mx.array, history: Sequence[int], inputs: Sequence[int]) -> mx.array:
        """Each row's distribution after the sampler chain, in log space: what the token is drawn
        from (greedy: all on the argmax), llama-server's `post_sampling_probs`."""
        logits = self.processed_rows(logits, history, inputs)
        if self.greedy:
            best = mx.argmax(logits, axis=-1, keepdims=True)
            return mx.where(mx.arange(logits.shape[-1])[None] == best, 0.0, -mx.inf)
        lp = self.tempered(self.filtered_logprobs(logits))
        return lp - mx.logsumexp(lp, axis=-1, keepdims=True)

    def decide(self, logits: mx.array, history: Sequence[int], inputs: Sequence[int]) -> list[int]:
        """Token for every row of `logits` (R, V); `inputs` are the tokens fed (inputs[0] = last).

        Returns the R tokens the target's own sampler picks; callers compare drafts to them.
        """
        logits = self.processed_rows(logits, history, inputs)
        if self.greedy:
            return argmax_rows(logits)
        lp = self.filtered_logprobs(logits)
        start = len(history) - self.prompt_len
        scaled = self.tempered(lp)
        picks = [mx.random.categorical(scaled[r], key=self.key(start + r)) for r in range(lp.shape[0])]
        return mx.stack(picks).tolist()


def argmax_rows(logits: mx.array) -> list[int]:
    """The greedy token of every row of `logits` (R, V), ties to the lowest id as mx.argmax.

    On the CPU through numpy on the evaluated rows: MLX's CPU argmax is an element-at-a-time loop,
    0.25 ms for 3 rows of a 49K vocabulary against 0.01 ms, paid once per verify round or step
    (and by every request of a batched step). Elsewhere the rows stay on the device."""
    if mx.default_device() != mx.cpu:
        return mx.argmax(logits, axis=-1).tolist()
    if logits.dtype != mx.float32:  # bfloat16 has no numpy type; widening keeps the order
        logits = logits.astype(mx.float32)
    return np.asarray(logits).argmax(axis=-1).tolist()

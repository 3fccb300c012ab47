"""The target answers the training prompts with its own decoding, batched, while the tap the
drafter reads records its rows: the drafter learns from exactly the features it will be fed.

Answers are drawn the way users decode: every other one greedy, the rest sampled (temperature
0.7), each from its own seed, so a run repeats. Sequences are decoded together through the
engine's batched step (continuous: a finished answer's slot takes the next prompt), on the same
row-exact kernel path plain decoding uses; each keeps its tap rows (`SequenceCache.keep_hidden`).
A sample is the prompt and answer ids and the tap's rows of every position but the last, in
float16 (half the memory; the drafter's `fc` reads them in its own dtype anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..engine.batch import batched_step
from ..engine.cache import SequenceCache
from ..models.taps import layer_tap

SAMPLED_TEMPERATURE = 0.7


@dataclass
class Sample:
    tokens: list[int]  # prompt then answer
    prompt_len: int
    features: mx.array  # (len(tokens) - 1, taps * hidden) float16: row j is position j's

    @property
    def answer_len(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class _Slot:
    seq: SequenceCache
    index: int
    prompt_len: int
    next_token: int
    produced: int = 0


def record(
    model: Any,
    encode: Callable[[str], list[int]],
    eos_ids: Sequence[int],
    prompts: Sequence[str],
    tap_layers: Sequence[int],
    *,
    max_tokens: int,
    batch: int,
    seed: int,
    first_index: int = 0,
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[Sample]:
    """Samples as answers finish (prompt i gets seed `seed + first_index + i`); ends when the
    prompts run out or `stop()` says so (the slots in flight are dropped)."""
    tap = layer_tap(model, list(tap_layers))
    eos = set(eos_ids)
    queue = iter(enumerate(prompts, first_index))
    slots: list[_Slot] = []

    def start() -> bool:
        item = next(queue, None)
        if item is None:
            return False
        index, text = item
        ids = encode(text)
        seq = SequenceCache(model)
        seq.keep_hidden(tap)
        if len(ids) > 1:
            seq.prefill(ids[:-1])
        slots.append(_Slot(seq, index, len(ids), ids[-1]))
        return True

    while len(slots) < batch and start():
        pass
    while slots and not stop():
        logits = batched_step(model, [s.seq for s in slots], [s.next_token for s in slots])
        picks = _pick(logits, [s.index for s in slots], [s.produced for s in slots], seed)
        done = []
        for slot, token in zip(slots, picks):
            slot.produced += 1
            if token in eos or slot.produced >= max_tokens:
                done.append(slot)
                yield _finish(slot, token)
            else:
                slot.next_token = token
        for slot in done:
            slots.remove(slot)
            start()
        for s in slots:
            s.seq.eval()


def _pick(logits: mx.array, indexes: list[int], produced: list[int], seed: int) -> list[int]:
    greedy = mx.argmax(logits, axis=-1).tolist()
    out = []
    for row, (i, n) in enumerate(zip(indexes, produced)):
        if i % 2 == 0:
            out.append(greedy[row])
        else:
            key = mx.random.key((seed + i) * 100_003 + n)
            out.append(mx.random.categorical(logits[row] / SAMPLED_TEMPERATURE, key=key).item())
    return out


def _finish(slot: _Slot, last: int) -> Sample:
    seq = slot.seq
    tokens = list(seq.tokens) + [last]
    features = seq.hidden_rows(0, len(seq.tokens)).astype(mx.float16)
    mx.eval(features)
    return Sample(tokens=tokens, prompt_len=slot.prompt_len, features=features)

"""The target answers the training prompts with its own decoding, batched, while the tap the
drafter reads records its rows: the drafter learns from exactly the features it will be fed.

Answers are drawn the way users decode: every other one greedy, the rest sampled (temperature
0.7), each from its own seed, so a run repeats. Sequences are decoded together through the
engine's batched step (continuous: a finished answer's slot takes the next prompt), on the same
row-exact kernel path plain decoding uses; each keeps its tap rows (`SequenceCache.keep_hidden`).
A sample is the prompt and answer ids, the target's greedy pick at every answer position (the
label: greedy verification accepts a draft when it is that pick, so a sampled answer still
teaches what greedy decoding checks, from a context greedy decoding would not have reached), and
the tap's rows of every position but the last, in float16 (half the memory; the drafter's `fc`
reads them in its own dtype anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
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
    labels: list[int] | None = None  # the target's greedy pick at each position (the prompt's: its own ids)

    def __post_init__(self) -> None:
        if self.labels is None:  # samples recorded before labels were kept: the answer itself
            self.labels = list(self.tokens)

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
    greedy: list[int] = field(default_factory=list)  # the target's greedy pick at each answer position


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
    all_sampled: bool = False,
) -> Iterator[Sample]:
    """Samples as answers finish (prompt i gets seed `seed + first_index + i`; every other answer
    greedy unless `all_sampled`: a prompt's second pass would repeat its greedy answer); ends when
    the prompts run out or `stop()` says so (the slots in flight are dropped)."""
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
        greedy = mx.argmax(logits, axis=-1).tolist()
        picks = _pick(logits, greedy, [s.index for s in slots], [s.produced for s in slots], seed, all_sampled)
        done = []
        for slot, token, best in zip(slots, picks, greedy):
            slot.produced += 1
            slot.greedy.append(best)
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


def _pick(
    logits: mx.array, greedy: list[int], indexes: list[int], produced: list[int], seed: int, all_sampled: bool
) -> list[int]:
    out = []
    for row, (i, n) in enumerate(zip(indexes, produced)):
        if i % 2 == 0 and not all_sampled:
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
    labels = tokens[: slot.prompt_len] + slot.greedy
    return Sample(tokens=tokens, prompt_len=slot.prompt_len, features=features, labels=labels)

"""Token events -> text pieces: streaming detokenization and stop strings.

A stop string ends the output before the string (OpenAI / llama-server semantics), also when it
arrives inside an accepted draft block; text that could still become a stop string is held back
until it cannot. Closing the token iterator ends the engine's generation where the text ended.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .generation import RoundLoop


@dataclass(frozen=True)
class TextPiece:
    text: str
    tokens: int  # tokens emitted so far
    ids: tuple[int, ...] = ()  # the tokens since the previous piece (llama-server's stream `tokens`)
    drafted: int = 0  # how many of `ids` were accepted draft tokens


class TextStream:
    """Iterate text pieces of a RoundLoop; `finish_reason` and `stop_word` when done. A scheduled
    RoundLoop's Ticks come through as they are, between the pieces."""

    def __init__(self, generation: RoundLoop, tokenizer, stop: Sequence[str] = ()):
        self.generation = generation
        self.detok = tokenizer.detokenizer
        self.stop = [s for s in stop if s]
        self.finish_reason: str | None = None
        self.stop_word: str | None = None
        self.text = ""

    def __iter__(self) -> Iterator[TextPiece]:
        self.detok.reset()
        pending = ""
        count = 0
        fresh: list[int] = []
        drafted = 0

        def piece_of(text: str) -> TextPiece:
            nonlocal drafted
            ids, n = tuple(fresh), drafted
            fresh.clear()
            drafted = 0
            return TextPiece(text, count, ids, n)

        hold = max((len(s) for s in self.stop), default=0) - 1
        try:
            for event in self.generation:
                if not hasattr(event, "token"):  # a scheduler's Tick (engine.PAUSE / NEED_STEP): passed on
                    yield event
                    continue
                count += 1
                fresh.append(event.token)
                drafted += event.from_draft
                self.detok.add_token(event.token)
                pending += self.detok.last_segment
                if self.stop:
                    cut = self._find_stop(pending)
                    if cut is not None:
                        piece = pending[:cut]
                        self.text += piece
                        if piece:
                            yield piece_of(piece)
                        self.finish_reason = "stop"
                        return
                    safe = len(pending) - hold if hold > 0 else len(pending)
                    if safe <= 0:
                        continue
                    piece, pending = pending[:safe], pending[safe:]
                else:
                    piece, pending = pending, ""
                if piece:
                    self.text += piece
                    yield piece_of(piece)
            self.detok.finalize()
            pending += self.detok.last_segment
            if self.stop:
                cut = self._find_stop(pending)
                if cut is not None:
                    pending = pending[:cut]
                    self.finish_reason = "stop"
            if pending:
                self.text += pending
                yield piece_of(pending)
            if self.finish_reason is None:
                self.finish_reason = self.generation.finish_reason
        finally:
            self.generation.close()

    def _find_stop(self, text: str) -> int | None:
        best = None
        for s in self.stop:
            i = text.find(s)
            if i >= 0 and (best is None or i < best):
                best, self.stop_word = i, s
        return best

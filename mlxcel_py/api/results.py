"""What API calls return: `Generation` (token ids, then stats), `Stats`, and the `StreamPiece`s of
`stream`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..engine.text import TextStream


@dataclass(frozen=True)
class Stats:
    """A generation's counters. steps: target forwards after the prompt (plain steps and verify
    rounds); verifies: rounds that verified a proposal; drafted/accepted: proposed and accepted
    draft tokens; pauses: rounds the policy declined to draft."""

    steps: int
    verifies: int
    drafted: int
    accepted: int
    pauses: int
    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_s: float
    decode_tps: float
    acceptance_rate: float
    draft_kind: str | None
    policy: str | None

    @classmethod
    def of(cls, st: Any) -> Stats:
        return cls(
            st.rounds,
            st.drafted_rounds,
            st.proposed,
            st.accepted,
            st.paused_rounds,
            st.prompt_tokens,
            st.generated_tokens,
            st.prefill_s,
            st.decode_s,
            st.decode_tps,
            st.acceptance_rate,
            st.draft_kind,
            st.policy,
        )


class Generation:
    """An iterator of token ids; `stats()`, `finish_reason` and `tokens` once it has run."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __iter__(self) -> Iterator[int]:
        for event in self._inner:
            yield event.token

    @property
    def finish_reason(self) -> str | None:
        return self._inner.finish_reason

    @property
    def tokens(self) -> list[int]:
        return list(self._inner.tokens)

    def stats(self) -> Stats:
        return Stats.of(self._inner.stats)

    def close(self) -> None:
        self._inner.close()


class StreamPiece(str):
    """One streamed piece of a reply (mlx-lm's `stream_generate` yields such objects): the text
    itself, so `"".join(mc.stream(...))` and `print(piece, end="")` work as on strings, and

    - `text`: the text as a plain str;
    - `tokens`: the token ids this piece completes;
    - `from_draft`: how many of them were draft tokens the target accepted;
    - `generated`: tokens generated so far; `tokens_per_second`: decoding speed so far (after the prompt);
    - `finish_reason`: on the last piece ("stop", "length", ...; its text may be empty), else None.
    """

    tokens: tuple[int, ...]
    from_draft: int
    generated: int
    tokens_per_second: float
    finish_reason: str | None

    def __new__(
        cls,
        text: str,
        tokens: tuple[int, ...] = (),
        from_draft: int = 0,
        generated: int = 0,
        tokens_per_second: float = 0.0,
        finish_reason: str | None = None,
    ) -> StreamPiece:
        piece = super().__new__(cls, text)
        piece.tokens, piece.from_draft, piece.generated = tokens, from_draft, generated
        piece.tokens_per_second, piece.finish_reason = tokens_per_second, finish_reason
        return piece

    @property
    def text(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return (
            f"StreamPiece({self.text!r}, tokens={self.tokens}, from_draft={self.from_draft}, "
            f"finish_reason={self.finish_reason!r})"
        )


def _pieces(text: TextStream) -> Iterator[StreamPiece]:
    """Validation ran when stream() was called; this only runs the generation."""
    gen = text.generation
    start = time.perf_counter()

    def speed(tokens: int) -> float:
        decoding = time.perf_counter() - start - gen.stats.prefill_s
        return tokens / decoding if decoding > 0 else 0.0

    try:
        for piece in text:
            yield StreamPiece(piece.text, piece.ids, piece.drafted, piece.tokens, speed(piece.tokens))
        n = gen.stats.generated_tokens
        yield StreamPiece("", (), 0, n, speed(n), text.finish_reason)
    finally:
        gen.close()

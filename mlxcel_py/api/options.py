"""What one API call asks for: `GenerateOptions` (budget, sampling, stops) and `DraftPolicy` (how
many tokens a round proposes), checked as the CLI's parser types them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..drafters import registry
from ..engine.policy import make_policy, on_cuda
from ..errors import UsageError
from ..options import (
    DEFAULT_MAX_DRAFT,
    MAX_DRAFT_LIMIT,
    POLICIES,
)

DEFAULT_API_MAX_TOKENS = 256  # mlx-lm's generate() default; the CLI's is -1 (until EOS)


@dataclass(frozen=True)
class GenerateOptions:
    """One request's budget and sampling (temperature 0: greedy). `stop` applies to text (generate,
    stream); speculative_generate speaks token ids and ignores it."""

    max_tokens: int = DEFAULT_API_MAX_TOKENS  # -1: until EOS or the context window
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    repeat_last_n: int = -1
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()

    def _params(self) -> dict:
        """The CLI's parameters, typed as its parser types them (so messages read the same)."""
        f, i = _number(float), _number(int)
        return dict(
            max_tokens=i("max_tokens", self.max_tokens),
            temp=f("temperature", self.temperature),
            top_p=f("top_p", self.top_p),
            top_k=i("top_k", self.top_k),
            min_p=f("min_p", self.min_p),
            seed=None if self.seed is None else i("seed", self.seed),
            repetition_penalty=f("repetition_penalty", self.repetition_penalty),
            repeat_last_n=i("repeat_last_n", self.repeat_last_n),
            min_tokens=i("min_tokens", self.min_tokens),
            ignore_eos=bool(self.ignore_eos),
            stop=_strings("stop", self.stop),
        )


def _number(kind: type):
    def coerce(name: str, value: Any):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or (kind is int and value != int(value)) or value != value:  # NaN is no number
            raise UsageError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        return kind(value)

    return coerce


def _strings(name: str, values: Any) -> tuple[str, ...]:
    given = values
    if isinstance(values, str):
        values = (values,)
    elif values is None or isinstance(values, (list, tuple)):
        values = tuple(values or ())
    if not isinstance(values, tuple) or not all(isinstance(v, str) for v in values):
        raise UsageError(f"{name} must be a string or a list of strings, got {given!r}")
    return values


@dataclass(frozen=True)
class DraftPolicy:
    """How many tokens a round proposes. `auto()`: the drafter kind's own (the CLI's defaults);
    `adaptive(n)`: an acceptance-driven width up to n (mlxcel's graded policy); `fixed(n)`: n every
    round; `cost(n)`: the break-even governor (README, Speculative decoding)."""

    name: str = "auto"
    max_draft: int | None = None

    @classmethod
    def auto(cls, max_draft: int | None = None) -> DraftPolicy:
        return cls("auto", max_draft)

    @classmethod
    def adaptive(cls, max_draft: int = DEFAULT_MAX_DRAFT) -> DraftPolicy:
        return cls("graded", max_draft)

    @classmethod
    def fixed(cls, n: int) -> DraftPolicy:
        return cls("fixed", n)

    @classmethod
    def cost(cls, max_draft: int = DEFAULT_MAX_DRAFT) -> DraftPolicy:
        return cls("cost", max_draft)

    def _make(self, kind: str, verify_cost: Sequence[float] | None):
        if self.name != "fixed" and self.name not in POLICIES:
            raise UsageError(f"DraftPolicy {self.name!r} is not one of fixed, {', '.join(POLICIES)}")
        entry = registry.KINDS.get(kind)
        fixed = entry is not None and entry.sizing == registry.FIXED
        width = self.max_draft if self.max_draft is not None else (entry.default_width if fixed else DEFAULT_MAX_DRAFT)
        if not 1 <= width <= MAX_DRAFT_LIMIT:
            raise UsageError(f"DraftPolicy max_draft must be between 1 and {MAX_DRAFT_LIMIT}, got {width}")
        if self.name == "fixed" or (self.name == "auto" and fixed):
            return make_policy("fixed", width, adaptive=False)
        return make_policy(self.name, width, on_cuda=on_cuda(), verify_cost=verify_cost)

"""What a request's output is constrained to (a JSON schema, GBNF, Lark or a regex), and whether it
compiles: pure, so validation can refuse a bad grammar before any model loads. The constraint
that runs in the round loop is engine/grammar.py; the compiler behind both is llguidance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORMATS = ("json_schema", "gbnf", "lark", "regex")
_NAMES = {"json_schema": "JSON schema", "gbnf": "GBNF grammar", "lark": "Lark grammar", "regex": "regex"}


class GrammarError(ValueError):
    """A grammar that cannot be compiled; the message says where."""


@dataclass(frozen=True)
class GrammarSpec:
    """`kind` one of FORMATS; `text` its source (a JSON schema as JSON text)."""

    kind: str
    text: str

    def describe(self) -> str:
        return _NAMES.get(self.kind, self.kind)


def _first_line(x: Any) -> str:
    text = str(x).strip()
    return text.splitlines()[0] if text else type(x).__name__


def compiled(spec: GrammarSpec) -> str:
    """The llguidance grammar of `spec`; GrammarError if it does not compile."""
    import llguidance

    if spec.kind not in FORMATS:
        raise GrammarError(f"unknown grammar kind {spec.kind!r}; one of {', '.join(FORMATS)}")
    try:
        grammar = llguidance.grammar_from(spec.kind, spec.text)
    except Exception as exc:  # its converters raise ValueError, or bare Exceptions for bad input
        raise GrammarError(f"the {spec.describe()} does not compile: {_first_line(exc)}") from None
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise GrammarError(f"the {spec.describe()} does not compile: {_first_line(problem)}")
    return grammar


def check(spec: GrammarSpec) -> None:
    """Raise GrammarError if `spec` does not compile (no tokenizer needed)."""
    compiled(spec)

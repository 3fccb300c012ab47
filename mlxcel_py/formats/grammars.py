"""What a request's output is constrained to (a JSON schema, GBNF, Lark or a regex), and whether it
compiles: pure, so validation can refuse a bad grammar before any model loads. The constraint
that runs in the round loop is engine/grammar.py; the compiler behind both is llguidance.

Hostile grammars are an expected input (a server takes them from any client), so two guards stand
before and around the compiler:

- `check_bounds` refuses, in plain Python and before any native code sees the text, a grammar
  over `LIMITS` (its size, its rules or definitions and `$ref`s, a schema's nesting). llguidance
  recurses once per rule of a reference chain, about 8 KiB of stack each: a chain of 1,000
  `$ref`s overflowed the 8 MiB stack of the thread it ran on and took the process down with a
  segfault, and llguidance's GBNF converter (Python) grows faster than linearly with the chain
  (1,000 rules 1.2 s, 3,000 6.4 s on this 2-core VM).
- `native` runs every call into llguidance on a thread of its own with a 256 MiB stack (address
  space; only the pages touched are memory), joined within a time budget. Within the bounds the
  deepest chain uses a few MiB, so a shape nobody thought of still has tens of times the room
  before it could overflow; a compile that outlives the budget fails its request (the thread,
  bounded by the limits, finishes on its own and its result is dropped).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

FORMATS = ("json_schema", "gbnf", "lark", "regex")
_NAMES = {"json_schema": "JSON schema", "gbnf": "GBNF grammar", "lark": "Lark grammar", "regex": "regex"}


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on a grammar's text, checked before compiling (docs/serving.md, "Limits")."""

    chars: int = 256 * 1024  # the grammar's or schema's text
    rules: int = 1000  # GBNF/Lark rules; a schema's definitions, and its $refs
    nesting: int = 64  # a schema's objects and arrays inside each other
    seconds: float = 10.0  # compiling (the worst grammar within the bounds: about 1.2 s here)


LIMITS = GrammarLimits()
NATIVE_STACK = 256 * 2**20  # bytes of stack for the thread that runs llguidance


class GrammarError(ValueError):
    """A grammar that cannot be compiled, or one over a limit; the message says which."""


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


_GBNF_RULE = re.compile(r"::=")
# a Lark rule or terminal starts a line: `name:`, `?name:`, `!name:`, `NAME.2:`
_LARK_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(?:\.-?\d+)?[ \t]*:", re.M)


def _schema_counts(node: Any, depth: int, limits: GrammarLimits, counts: list[int]) -> None:
    """Walk a parsed schema: nesting depth checked as it goes, [definitions, $refs] counted."""
    if depth > limits.nesting:
        raise GrammarError(f"the JSON schema nests more than {limits.nesting} levels deep (the limit)")
    if isinstance(node, dict):
        for key in ("$defs", "definitions"):
            if isinstance(node.get(key), dict):
                counts[0] += len(node[key])
        if "$ref" in node:
            counts[1] += 1
        for value in node.values():
            if isinstance(value, (dict, list)):
                _schema_counts(value, depth + 1, limits, counts)
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, (dict, list)):
                _schema_counts(value, depth + 1, limits, counts)


def check_bounds(spec: GrammarSpec, limits: GrammarLimits = LIMITS) -> None:
    """GrammarError if `spec` is over a limit; pure Python, before any native code sees it."""
    name = spec.describe()
    if len(spec.text) > limits.chars:
        raise GrammarError(f"the {name} has {len(spec.text)} characters; the limit is {limits.chars}")
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.text)
        except RecursionError:
            raise GrammarError(f"the JSON schema nests more than {limits.nesting} levels deep (the limit)") from None
        except ValueError:
            return  # not JSON: the compiler's own message says where
        counts = [0, 0]
        _schema_counts(schema, 0, limits, counts)
        for count, what in zip(counts, ("definitions", "'$ref's")):
            if count > limits.rules:
                raise GrammarError(f"the JSON schema has {count} {what}; the limit is {limits.rules}")
    elif spec.kind in ("gbnf", "lark"):
        pattern = _GBNF_RULE if spec.kind == "gbnf" else _LARK_RULE
        rules = len(pattern.findall(spec.text))
        if rules > limits.rules:
            raise GrammarError(f"the {name} has {rules} rules; the limit is {limits.rules}")


T = TypeVar("T")
_stack_size_lock = threading.Lock()


def native(fn: Callable[..., T], *args: Any, seconds: float = LIMITS.seconds, what: str = "the grammar") -> T:
    """`fn(*args)` on a fresh thread with a NATIVE_STACK stack, waited for at most `seconds`
    (GrammarError past that). Its exception, if any, is raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    with _stack_size_lock:  # threading.stack_size is process-wide: set it only around this start
        previous = threading.stack_size(NATIVE_STACK)
        try:
            thread = threading.Thread(target=run, name="mlxcel-grammar", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join(seconds)
    if thread.is_alive():
        raise GrammarError(f"{what} did not compile within {seconds:g} s (the limit)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _compile_text(spec: GrammarSpec) -> str:
    import llguidance

    try:
        grammar = llguidance.grammar_from(spec.kind, spec.text)
    except RecursionError:
        raise GrammarError(f"the {spec.describe()} does not compile: nested too deeply") from None
    except Exception as exc:  # its converters raise ValueError, or bare Exceptions for bad input
        raise GrammarError(f"the {spec.describe()} does not compile: {_first_line(exc)}") from None
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise GrammarError(f"the {spec.describe()} does not compile: {_first_line(problem)}")
    return grammar


def compiled(spec: GrammarSpec, limits: GrammarLimits = LIMITS) -> str:
    """The llguidance grammar of `spec`; GrammarError if it is over a limit or does not compile."""
    if spec.kind not in FORMATS:
        raise GrammarError(f"unknown grammar kind {spec.kind!r}; one of {', '.join(FORMATS)}")
    check_bounds(spec, limits)
    return native(_compile_text, spec, seconds=limits.seconds, what=f"the {spec.describe()}")


def check(spec: GrammarSpec) -> None:
    """Raise GrammarError if `spec` is over a limit or does not compile (no tokenizer needed)."""
    compiled(spec)

"""Benchmark workloads: JSON Lines of {"kind", "prompt", "source"?}, as in ../shared/workloads,
and multi-turn traces: JSON Lines of {"turns": [user messages], "source"?} (traces.jsonl there).

Pure Python, read before any model loads so a bad file is a usage error naming the file and line.
`builtin()` is the small default set shipped with the package (two edits, two code rewrites, a
reformat, two free prose prompts), used when `mlxcel bench` gets no --workload.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

BUILTIN = Path(__file__).parents[1] / "data" / "bench_default.jsonl"


@dataclass(frozen=True)
class WorkItem:
    kind: str
    prompt: str
    source: str = ""


def _json_lines(path: Path, flag: str, shape: str):
    """(line number, object) for each non-blank line; a missing, unreadable or non-JSON file is a
    usage error naming the file and line."""
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file; pass a JSON Lines file of {shape} objects")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc})") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{flag} {path}:{n}: not valid JSON ({exc.msg}); one object per line") from None


def load(path: Path, *, flag: str = "--workload") -> list[WorkItem]:
    items = []
    for n, obj in _json_lines(path, flag, '{"kind", "prompt"}'):
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise UsageError(f'{flag} {path}:{n}: each line needs a non-empty string "prompt"')
        kind = obj.get("kind", "default")
        if not isinstance(kind, str) or not kind:
            raise UsageError(f'{flag} {path}:{n}: "kind" must be a non-empty string')
        items.append(WorkItem(kind=kind, prompt=obj["prompt"], source=str(obj.get("source", ""))))
    if not items:
        raise UsageError(f"{flag} {path}: the file holds no prompts")
    return items


@dataclass(frozen=True)
class Trace:
    turns: tuple[str, ...]
    source: str = ""


def load_traces(path: Path, *, flag: str = "--trace") -> list[Trace]:
    traces = []
    for n, obj in _json_lines(path, flag, '{"turns": [...]}'):
        turns = obj.get("turns") if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UsageError(f'{flag} {path}:{n}: each line needs "turns": a non-empty list of non-empty strings')
        traces.append(Trace(tuple(turns), str(obj.get("source", ""))))
    if not traces:
        raise UsageError(f"{flag} {path}: the file holds no traces")
    return traces


def builtin() -> list[WorkItem]:
    return load(BUILTIN, flag="built-in workload")


def limit_per_kind(items: list[WorkItem], limit: int | None) -> list[WorkItem]:
    """Keep at most `limit` prompts of each kind, in file order."""
    if not limit:
        return items
    seen: dict[str, int] = {}
    kept = []
    for it in items:
        if seen.get(it.kind, 0) < limit:
            seen[it.kind] = seen.get(it.kind, 0) + 1
            kept.append(it)
    return kept

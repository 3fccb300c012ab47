"""The cache of GGUF conversions: what is in it, removing entries, and its size limit.

Each converted GGUF is one folder under `cache_dir()/gguf/` (convert.converted_dir: name, content
key, format). A conversion's COMPLETE marker is touched each time it is used, so its mtime says
when it was last used. After a new conversion the least recently used complete ones are removed
until the cache is under its limit (MLXCEL_CACHE_MAX_GB, default 20; the new one always stays),
and `mlxcel cache ls|rm` lists and removes entries by hand, as mlxcel's `list`/`rm` do.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ...errors import MlxcelError, UsageError
from ...paths import cache_dir

COMPLETE = "COMPLETE"  # a conversion's marker, written last (convert.py)
DEFAULT_MAX_GB = 20.0


@dataclass(frozen=True)
class Entry:
    path: Path
    bytes: int
    complete: bool
    source: str  # the GGUF it was converted from (its SOURCE file), or "" if unknown
    last_used: float  # the COMPLETE marker's mtime (else the folder's)

    @property
    def name(self) -> str:
        return self.path.name


def root() -> Path:
    return cache_dir() / "gguf"


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += (Path(dirpath) / f).stat().st_size
            except OSError:
                pass
    return total


def entries(where: Path | None = None) -> list[Entry]:
    """Every folder in the cache, least recently used first."""
    base = where or root()
    if not base.is_dir():
        return []
    out = []
    for p in base.iterdir():
        if not p.is_dir():
            continue
        marker = p / COMPLETE
        source = ""
        if (p / "SOURCE").is_file():
            source = (p / "SOURCE").read_text(errors="replace").strip().removeprefix("converted from ")
        used = (marker if marker.is_file() else p).stat().st_mtime
        out.append(Entry(p, _size(p), marker.is_file(), source, used))
    return sorted(out, key=lambda e: e.last_used)


def touch(folder: Path) -> None:
    """Record a use of this conversion (its marker's mtime)."""
    try:
        os.utime(folder / COMPLETE)
    except OSError:  # a read-only cache still serves its conversions
        pass


def limit_bytes() -> int:
    raw = os.environ.get("MLXCEL_CACHE_MAX_GB", "").strip()
    try:
        gb = float(raw) if raw else DEFAULT_MAX_GB
    except ValueError:
        raise UsageError(f"MLXCEL_CACHE_MAX_GB={raw!r}: not a number of gigabytes (for example 20)") from None
    return int(max(gb, 0.0) * 2**30)


def enforce_limit(keep: Path, where: Path | None = None) -> list[Entry]:
    """Remove least recently used conversions (never `keep`, never one another process is still
    writing) until the cache is within its limit; returns what was removed."""
    limit = limit_bytes()
    all_entries = entries(where)
    total = sum(e.bytes for e in all_entries)
    removed = []
    for e in all_entries:
        if total <= limit:
            break
        if e.path == keep or not e.complete or time.time() - e.last_used < 60:
            continue
        try:
            _delete(e.path)
        except OSError:  # another process's files, a read-only cache: it stays, and so do its bytes
            continue
        total -= e.bytes
        removed.append(e)
    return removed


def remove(names: list[str], *, everything: bool = False, incomplete: bool = False) -> list[Entry]:
    """Remove the named entries (or all, or the incomplete ones); an unknown name is an error."""
    known = {e.name: e for e in entries()}
    if everything:
        picked = list(known.values())
    elif incomplete:
        picked = [e for e in known.values() if not e.complete]
    else:
        missing = [n for n in names if n not in known]
        if missing:
            raise UsageError(
                f"no cache entry named {', '.join(missing)}; `mlxcel cache ls` lists them",
                hint="pass a name from the first column, --incomplete or --all",
            )
        picked = [known[n] for n in names]
    removed, failed = [], []
    for e in picked:
        try:
            _delete(e.path)
            removed.append(e)
        except OSError as exc:
            failed.append(f"{e.name} ({exc.strerror or exc})")
    if failed:
        raise MlxcelError(
            f"could not remove {', '.join(failed)}"
            + (f"; removed {len(removed)} other conversion(s)" if removed else "")
        )
    return removed


def _delete(path: Path) -> None:
    """An entry: a folder with its files, or a symbolic link placed in the cache (the link only,
    never what it points to; rmtree refuses links, and that refusal was silently ignored)."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path)

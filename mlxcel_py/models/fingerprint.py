"""A model folder's fingerprint: what a trained drafter records about the target it was trained
for, so a mismatched pair is refused at load instead of drafting garbage.

Hashing every byte of a multi-gigabyte model at each load would cost seconds, so the fingerprint
is SHA-256 over config.json's text and, for each weight file (sorted by name), its name, its size
and its first and last MiB: a re-quantized, fine-tuned or different model changes it, a copy of
the same folder does not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz")


def fingerprint(folder: Path, gguf: Path | None = None) -> str:
    """A folder's fingerprint; a model converted from a GGUF file is fingerprinted by that file
    (its conversion is a cache entry that may be rebuilt)."""
    h = hashlib.sha256()
    if gguf is not None:
        _add_file(h, gguf)
        return h.hexdigest()
    cfg = folder / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    for f in sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)):
        _add_file(h, f)
    return h.hexdigest()


def _add_file(h: Any, f: Path) -> None:
    size = f.stat().st_size
    h.update(f"{f.name}\0{size}\0".encode())
    with f.open("rb") as fh:
        h.update(fh.read(CHUNK))
        if size > CHUNK:
            fh.seek(max(CHUNK, size - CHUNK))
            h.update(fh.read(CHUNK))

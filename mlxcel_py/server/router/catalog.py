"""What a `--models-dir` folder offers, as llama-server's router reads one (the Hugging Face
cache's models are hub_cache's): a `.gguf` file at the
top level is a model named by its stem; a sub-folder is a model named by the folder, either a
model folder (a `config.json`: safetensors, MLX) or GGUF files (the first shard of a split
model, with an `mmproj*.gguf` beside it as its vision projector). Files whose names start with
`mmproj` are never models themselves; hidden entries are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True)
class Entry:
    id: str
    path: Path  # a .gguf file or a model folder
    mmproj: Path | None = None
    draft: Path | None = None  # a preset's `spec-draft-hf`, resolved in the cache
    source: str = "models_dir"  # llama-server's: "models_dir", "preset" or "cache" (the Hugging Face cache: removable)
    listed: bool = True  # False: hidden from GET /models by a preset's dedup-cache-models, still usable


@dataclass
class Preset:
    """A --models-preset file, read (commands/_router_argv.py): serve flags per section (`*`:
    every model), the models it adds (`model = PATH`), those loaded at startup, stop timeouts."""

    flags: dict[str, list[str]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    startup: set[str] = field(default_factory=set)
    stop_timeout: dict[str, float] = field(default_factory=dict)
    hf: dict[str, str] = field(default_factory=dict)  # `hf-repo` per section: OWNER/NAME[:QUANT]
    hf_file: dict[str, str] = field(default_factory=dict)  # `hf-file`: that file of the repo
    draft_hf: dict[str, str] = field(default_factory=dict)  # `spec-draft-hf` per section
    dedup: set[str] = field(default_factory=set)  # sections (`*`: all) with dedup-cache-models on

    def dedups(self, model_id: str) -> bool:
        return model_id in self.dedup or "*" in self.dedup

    def flags_for(self, model_id: str) -> list[str]:
        """`[*]`'s flags, then the model's own (the later spelling of a flag counts)."""
        return [*self.flags.get("*", []), *self.flags.get(model_id, [])]


def _model_ggufs(files: list[Path]) -> list[Path]:
    """The GGUF files that start a model: not projectors, not second or later shards."""
    out = []
    for f in files:
        if f.suffix.lower() != ".gguf" or f.name.lower().startswith("mmproj") or f.name.startswith("."):
            continue
        shard = _SHARD.search(f.stem)
        if shard is None or int(shard.group(1)) == 1:
            out.append(f)
    return out


def discover(folder: Path) -> list[Entry]:
    entries: list[Entry] = []
    children = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    for f in _model_ggufs([p for p in children if p.is_file()]):
        entries.append(Entry(f.stem, f))
    for d in (p for p in children if p.is_dir()):
        if (d / "config.json").is_file():
            entries.append(Entry(d.name, d))
            continue
        files = sorted(p for p in d.iterdir() if p.is_file())
        models = _model_ggufs(files)
        if not models:
            continue
        mmproj = next((f for f in files if f.name.lower().startswith("mmproj") and f.suffix.lower() == ".gguf"), None)
        entries.append(Entry(d.name, models[0], mmproj))
    seen: set[str] = set()
    unique = []
    for e in entries:  # a file and a folder of one name: the first found keeps it
        if e.id not in seen:
            seen.add(e.id)
            unique.append(e)
    return unique

"""A model from the Hugging Face hub by llama.cpp's `-hf OWNER/NAME[:QUANT]` rules, into the cache
hub_cache reads (llama.cpp, huggingface_hub and mlx-lm share it).

- `repo_files(repo)`: the repo's file list on the hub (ValueError with the reason: no such repo,
  no network, offline).
- `gguf_files(names, repo, tag)`: what a spec stands for among them: the quant's model file
  (without a quant Q4_K_M, then Q8_0, then the first), every shard of a split model, and a
  projector of the repo; [] when the repo has no GGUF model (an MLX or safetensors repo).
- `fetch(spec, file)`: the local path of `-hf SPEC [-hff FILE]`: the cache's copy, else downloaded
  with huggingface_hub's progress bars on stderr (HF_ENDPOINT, HF_TOKEN; never under
  HF_HUB_OFFLINE). A repo without GGUF files is an mlx-lm repo: its id is returned for
  loading.resolve, which fetches its snapshot.
- `preset_file(spec)`: a preset repo's `preset.ini` (llama-server runs such a repo as a router).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelError
from . import hub_cache

PRESET = "preset.ini"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def repo_files(repo: str) -> list[str]:
    try:
        from huggingface_hub import HfApi

        return list(HfApi().list_repo_files(repo))
    except Exception as exc:  # noqa: BLE001 - missing repo, no network, offline: one line with the reason
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot list {repo} on the Hugging Face hub: {reason}") from None


def gguf_files(names: list[str], repo: str, tag: str) -> list[str]:
    found = [hub_cache.CachedFile(repo, n, Path(n)) for n in sorted(names)]
    best = hub_cache.best_model(found, tag)
    if best is None:
        if tag:
            raise ValueError(f"{repo} has no {tag} GGUF on the Hugging Face hub")
        return []
    split = hub_cache.split_info(best.rel)
    out = [best.rel]
    if split is not None and split.count > 1:
        out = [
            f.rel
            for f in found
            if (s := hub_cache.split_info(f.rel)) is not None and s.prefix == split.prefix and s.count == split.count
        ]
    projector = hub_cache.projector(found, best)
    return out + ([projector.as_posix()] if projector is not None else [])


def fetch(spec: str, file: str | None = None, what: str = "--hf-repo", file_what: str = "--hf-file") -> str:
    """A local .gguf path (or a repo id for loading.resolve) for `-hf SPEC [-hff FILE]`. The repo's
    projector is downloaded with its model but loads only with --mmproj (few kinds convert here)."""
    repo, tag = hub_cache.split_spec(spec)
    root = hub_cache.cache_root()
    cached = hub_cache.resolve(root, spec, file)
    if cached is not None:
        return str(cached)
    if offline():
        raise ModelError(
            f"{what} {spec}: not in the Hugging Face cache ({root}), and --offline (HF_HUB_OFFLINE) forbids downloading it",
            hint="drop --offline where the hub is reachable",
        )
    try:
        names = repo_files(repo)
        wanted = [file] if file else gguf_files(names, repo, tag)
    except ValueError as exc:
        raise ModelError(f"{what} {spec}: {exc}") from None
    if file and file not in names:
        raise ModelError(f"{file_what} {file}: no such file in {repo} on the Hugging Face hub")
    if not wanted:
        return repo  # an mlx-lm repo: loading.resolve fetches its snapshot
    from huggingface_hub import hf_hub_download

    try:
        paths = [hf_hub_download(repo, name, cache_dir=str(root)) for name in wanted]
    except Exception as exc:  # noqa: BLE001 - network, disk: one line
        raise ModelError(f"{what} {spec}: download failed ({str(exc).strip()[:200] or type(exc).__name__})") from None
    return paths[0]


def preset_file(spec: str) -> Path | None:
    """`preset.ini` of a preset repo (cached, else from the hub), or None for a model repo."""
    repo, _ = hub_cache.split_spec(spec)
    root = hub_cache.cache_root()
    cached = hub_cache.resolve(root, repo, PRESET)
    if cached is not None:
        return cached
    if offline() or hub_cache.resolve(root, spec) is not None:
        return None
    try:
        names = repo_files(repo)
    except ValueError:
        return None  # fetch() says why, when the model is loaded
    if PRESET not in names or any(hub_cache.is_model_file(n) for n in names):
        return None
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo, PRESET, cache_dir=str(root)))

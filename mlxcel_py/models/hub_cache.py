"""The Hugging Face cache as llama-server's router reads it (llama.cpp's common/hf-cache.cpp and
download.cpp): the models `-hf` and `POST /models` downloaded, listed beside `--models-dir`'s.

- Where: $LLAMA_CACHE, else $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub,
  $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub (llama.cpp's order; since it moved to
  the hub's layout, llama.cpp, huggingface_hub and mlx-lm share one cache).
- A repo is `models--OWNER--NAME/` with `refs/` (a commit a line; `main` first) and
  `snapshots/COMMIT/` of files (links into `blobs/`).
- A GGUF model is listed as `OWNER/NAME:TAG`, the tag read from its file name as llama.cpp reads it
  (`...-Q4_K_M.gguf` -> `Q4_K_M`; a split model's first shard; projectors, imatrix files and
  drafters' GGUFs are not models). A projector (`mmproj*.gguf`) in the same repo goes with it.
- An MLX or safetensors model (a snapshot with `config.json` and `*.safetensors` whose
  `model_type` mlx-lm has) is listed as `OWNER/NAME`: what mlx-lm users' caches hold.
- `OWNER/NAME[:TAG]` resolves as llama.cpp's `find_best_model` does: the tag's file, or without a
  tag Q4_K_M, then Q8_0, then the first model file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..options import split_hub_spec as split_spec
from ..options import valid_hub_repo as valid_repo

_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


def cache_root() -> Path:
    for var, below in (
        ("LLAMA_CACHE", ""),
        ("HF_HUB_CACHE", ""),
        ("HUGGINGFACE_HUB_CACHE", ""),
        ("HF_HOME", "hub"),
        ("XDG_CACHE_HOME", "huggingface/hub"),
    ):
        base = os.environ.get(var)
        if base:
            return Path(base) / below if below else Path(base)
    return Path.home() / ".cache" / "huggingface" / "hub"


@dataclass(frozen=True)
class Split:
    prefix: str  # the name without .gguf and without a shard suffix
    tag: str  # upper case; '' when the name carries none
    index: int
    count: int


def split_info(name: str) -> Split | None:
    """llama.cpp's `get_gguf_split_info`: None for a name that is not .gguf."""
    if not name.endswith(".gguf"):
        return None
    prefix, index, count = name[: -len(".gguf")], 1, 1
    m = _SPLIT.match(prefix)
    if m is not None:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return Split(prefix, t.group(1).upper() if t else "", index, count)


def is_model_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and not any(word in name for word in NOT_MODELS)


@dataclass(frozen=True)
class CachedFile:
    repo: str
    rel: str  # its path in the snapshot, with /
    local: Path  # the snapshot's entry (a link into blobs/, or a file)


def _folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def _commit(repo_dir: Path) -> str | None:
    """The snapshot to read: refs/main's commit, else the first valid ref's."""
    refs = repo_dir / "refs"
    if not refs.is_dir():
        return None
    fallback = None
    for ref in sorted(refs.iterdir()):
        try:
            commit = ref.read_text().strip().splitlines()[0] if ref.is_file() else ""
        except (OSError, IndexError):
            continue
        if not _COMMIT.match(commit):
            continue
        if ref.name == "main":
            return commit
        fallback = fallback or commit
    return fallback


def _snapshot(root: Path, repo: str) -> Path | None:
    repo_dir = root / _folder(repo)
    commit = _commit(repo_dir)
    snap = repo_dir / "snapshots" / commit if commit else None
    return snap if snap is not None and snap.is_dir() else None


def repos(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if d.is_dir() and d.name.startswith("models--") and (d / "snapshots").is_dir():
            repo = d.name[len("models--") :].replace("--", "/")
            if valid_repo(repo):
                out.append(repo)
    return out


def files(root: Path, repo: str) -> list[CachedFile]:
    snap = _snapshot(root, repo)
    if snap is None:
        return []
    out = []
    for dirpath, _dirs, names in os.walk(snap):
        for name in sorted(names):
            local = Path(dirpath) / name
            out.append(CachedFile(repo, local.relative_to(snap).as_posix(), local))
    return sorted(out, key=lambda f: f.rel)


def best_model(found: list[CachedFile], tag: str) -> CachedFile | None:
    """llama.cpp's `find_best_model`: the tag's model file (a split model's first shard); with no
    tag Q4_K_M, then Q8_0, then the first model file."""
    starts = [f for f in found if is_model_file(f.rel) and (s := split_info(f.rel)) and (s.count == 1 or s.index == 1)]
    for t in [tag] if tag else list(DEFAULT_TAGS):
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        match = next((f for f in starts if pattern.search(f.rel)), None)
        if match is not None:
            return match
    return None if tag or not starts else starts[0]


def tag_of(rel: str) -> str:
    """The quant tag a GGUF file's name carries ('' for none, or for a file that is no GGUF)."""
    s = split_info(rel)
    return s.tag if s is not None else ""


def projector(found: list[CachedFile], model: CachedFile) -> Path | None:
    """A vision projector of the repo for `model`: in its folder first, its tag first."""
    folder = model.rel.rpartition("/")[0]
    tag = tag_of(model.rel)
    cands = [f for f in found if f.rel.rsplit("/", 1)[-1].startswith("mmproj") and f.rel.endswith(".gguf")]
    if not cands:
        return None

    def rank(f: CachedFile) -> tuple[int, int, str]:
        return (f.rel.rpartition("/")[0] != folder, tag_of(f.rel) != tag, f.rel)

    return min(cands, key=rank).local


def resolve(root: Path, spec: str, file: str | None = None) -> Path | None:
    """The cached model file for `OWNER/NAME[:TAG]` (`file`: that file of the repo), or None."""
    repo, tag = split_spec(spec)
    found = files(root, repo)
    if file:
        return next((f.local for f in found if f.rel == file), None)
    best = best_model(found, tag)
    if best is not None:
        return best.local
    snap = _snapshot(root, repo)
    if not tag and snap is not None and _mlx_model(snap):
        return snap
    return None


@dataclass(frozen=True)
class Model:
    id: str
    path: Path  # a .gguf file, or a snapshot folder
    mmproj: Path | None = None


def models(root: Path) -> list[Model]:
    """Every model of the cache, llama.cpp's `common_list_cached_models` plus MLX folders."""
    out: list[Model] = []
    seen: set[str] = set()
    for repo in repos(root):
        found = files(root, repo)
        for f in found:
            s = split_info(f.rel)
            if s is None or s.index != 1 or not s.tag or not is_model_file(f.rel) or not f.local.exists():
                continue
            model_id = f"{repo}:{s.tag}"
            if model_id not in seen:
                seen.add(model_id)
                out.append(Model(model_id, f.local, projector(found, f)))
        snap = _snapshot(root, repo)
        if snap is not None and repo not in seen and _mlx_model(snap):
            seen.add(repo)
            out.append(Model(repo, snap))
    return out


def _mlx_model(snap: Path) -> bool:
    """A folder mlx-lm loads: config.json with a model_type it has, and safetensors weights."""
    try:
        cfg = json.loads((snap / "config.json").read_text())
    except (OSError, ValueError):
        return False
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    if not isinstance(kind, str) or not re.fullmatch(r"[A-Za-z0-9_]+", kind):
        return False
    if not any(p.suffix == ".safetensors" for p in snap.iterdir()):
        return False
    return _mlx_lm_has(kind)


def _mlx_lm_has(kind: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec("mlx_lm")  # finds the package without importing it (and MLX)
    for where in (spec.submodule_search_locations or []) if spec else []:
        if (Path(where) / "models" / f"{kind}.py").is_file():
            return True
    try:
        from mlx_lm.utils import MODEL_REMAPPING  # the renamed families (mistral -> llama...)
    except Exception:  # noqa: BLE001 - no mlx-lm at all: nothing to list
        return False
    return kind in MODEL_REMAPPING


def remove(root: Path, spec: str) -> bool:
    """llama.cpp's `common_download_remove`: with a tag, that tag's files and the blobs only they
    used; without one, the whole repo. False when nothing was there."""
    repo, tag = split_spec(spec)
    repo_dir = root / _folder(repo)
    if not tag:
        if not repo_dir.is_dir():
            return False
        shutil.rmtree(repo_dir, ignore_errors=True)
        return not repo_dir.exists()
    doomed = [f for f in files(root, repo) if tag_of(f.rel) == tag]
    if not doomed:
        return False
    blobs = [f.local.resolve() for f in doomed if f.local.is_symlink()]
    for f in doomed:
        f.local.unlink(missing_ok=True)
    still_used = {p.resolve() for p in (repo_dir / "snapshots").rglob("*") if p.is_symlink()}
    for blob in blobs:
        if blob not in still_used and blob.is_relative_to((repo_dir / "blobs").resolve()):
            blob.unlink(missing_ok=True)
    return True


def discard_partial(root: Path, repo: str) -> None:
    """After a cancelled download: its unfinished blobs, and the repo's folder if nothing of it
    was ever complete (huggingface_hub writes `blobs/HASH.incomplete`, then links the snapshot)."""
    repo_dir = root / _folder(repo)
    for part in (repo_dir / "blobs").glob("*.incomplete"):
        part.unlink(missing_ok=True)
    if repo_dir.is_dir() and not files(root, repo):
        shutil.rmtree(repo_dir, ignore_errors=True)

"""Linux CPU fast path: put an optimized BLAS under MLX before `mlx.core` is imported.

The `mlx[cpu]` wheel links the reference (netlib) BLAS: a matmul is ~5x slower than OpenBLAS and a
verify block of 8 rows costs ~6x one row, which would make speculation useless. Loading OpenBLAS
with RTLD_GLOBAL first makes the dynamic linker bind MLX's `cblas_*`/`sgemm_` symbols to it.
This module must not import mlx; `prepare()` is called by the CLI (and test setup) before any
module that does. It owns only the BLAS choice; dequantizing weights for the CPU lives in loading.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from ..paths import cache_dir

DEBIAN_OPENBLAS = "/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0"


@dataclass(frozen=True)
class BlasState:
    """Which BLAS MLX ended up with, for `--verbose` and `--profile`."""

    name: str  # "openblas" | "reference" | "system" (macOS Accelerate / CUDA builds)
    path: str | None
    note: str


_state: BlasState | None = None


def _mlx_runs_on_cpu_linux() -> bool:
    if sys.platform != "linux":
        return False
    # A CUDA build brings its own cuBLAS and uses the GPU; only the CPU wheel needs the swap.
    for name in ("mlx_cuda", "mlx_cuda12", "mlx_cuda13"):
        if importlib.util.find_spec(name) is not None:
            return False
    return True


def _wheel_openblas() -> Path | None:
    """OpenBLAS from the `ngsolve-openblas` wheel, with a libgfortran it can find.

    That library needs `libgfortran.so.5`. When the system has none, borrow the copy the mlx-cpu
    wheel bundles (auditwheel renamed it) through a folder of symlinks: the library's RPATH is
    `$ORIGIN`, and `$ORIGIN` is the folder it was opened from, not the symlink target's.
    """
    spec = importlib.util.find_spec("ngsolve_openblas")
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(list(spec.submodule_search_locations)[0])
    libs = sorted(pkg.glob("libopenblas*.so*"))
    if not libs:
        return None
    if ctypes.util.find_library("gfortran"):
        return libs[0]
    mlx_libs = pkg.parent / "mlx_cpu.libs"
    gfortran = sorted(mlx_libs.glob("libgfortran*.so*"))
    if not gfortran:
        return None
    shim = cache_dir() / "blas-shim"
    try:
        shim.mkdir(parents=True, exist_ok=True)
        links = {"libopenblas.so.0": libs[0], "libgfortran.so.5": gfortran[0]}
        links.update({p.name: p for p in mlx_libs.glob("libquadmath*.so*")})
        for name, target in links.items():
            link = shim / name
            if link.is_symlink() and os.readlink(link) == str(target):
                continue
            tmp = shim / f".{name}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target)
            tmp.replace(link)  # atomic, so concurrent processes never see a half-made shim
    except OSError:
        return None
    return shim / "libopenblas.so.0"


def _candidates() -> list[Path]:
    arch = platform.machine()
    found: list[Path] = []
    debian = Path(DEBIAN_OPENBLAS.format(arch=arch))
    if debian.exists():
        found.append(debian)
    wheel = _wheel_openblas()
    if wheel is not None:
        found.append(wheel)
    return found


def prepare(blas: bool = True) -> BlasState:
    """Load OpenBLAS globally if MLX will run on a Linux CPU. Idempotent; call before mlx.core."""
    global _state
    if _state is not None:
        return _state
    if not _mlx_runs_on_cpu_linux():
        _state = BlasState("system", None, "MLX brings its own BLAS on this platform")
        return _state
    env = os.environ.get("MLXCEL_BLAS", "").strip()
    if not blas or env.lower() in ("0", "off", "none", "reference"):
        _state = BlasState("reference", None, "optimized BLAS turned off (--no-blas / MLXCEL_BLAS=off)")
        return _state
    if "mlx.core" in sys.modules:
        _state = BlasState("reference", None, "mlx.core was imported before the BLAS could be swapped")
        return _state
    candidates = [Path(env).expanduser()] if env else _candidates()
    errors = []
    for path in candidates:
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            continue
        _state = BlasState("openblas", str(path), "loaded before mlx.core")
        return _state
    note = "no OpenBLAS found (install ngsolve-openblas or Debian's libopenblas0-pthread)"
    if errors:
        note = "OpenBLAS failed to load: " + "; ".join(errors)
    _state = BlasState("reference", None, note)
    return _state


def state() -> BlasState | None:
    return _state

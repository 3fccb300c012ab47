"""The row-exact kernel extension (`_qmm`, built from csrc/): whether it is built and runs on this
CPU, which build (`MLXCEL_KERNEL_ISA`), its threads, and what it holds outside MLX's allocator.

Every user of the kernels asks `kernel_status()` first: the module, or None with the reason
(`mlxcel --version` prints it), so a machine without the extension runs float32 and says why.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import UsageError
from ..inputs.digits import whole_number

# Blocks of at least this many rows go through AMX tiles where the CPU has them (Sapphire Rapids
# and later; MLXCEL_NO_AMX=1 turns them off): bit-identical to the VNNI rows, so rows stay exact
# whichever path a block takes. Measured here (scripts/amx_rows.py, docs/bench/amx-rows.md):
# 1.1-1.5x over a forward's layers at 16-128 rows, 0.4-0.6x below 16 (the tile round trip and
# the float work per block cost more than the 8 vpdpbusd a row they save).
AMX_ROWS = 16

KERNEL_ISAS = ("avx512", "avxvnni", "avx2", "f32")  # MLXCEL_KERNEL_ISA: the kernel's build, or none
_ISA_NAMES = {"avx512": "AVX-512 VNNI", "avxvnni": "AVX-VNNI", "avx2": "AVX2"}


@functools.cache
def kernel_status() -> tuple[Any, str]:
    """(the _qmm module or None, a one-line description of why it is or is not in use).

    MLXCEL_KERNEL_ISA picks the kernel's build: `avx512`, `avxvnni`, `avx2` (all give the same
    bits, so an AVX-512 machine tests the AVX2 path) or `f32` (no kernel); unset, the best this
    CPU runs (in that order)."""
    if mx.default_device() != mx.cpu:
        return None, "not needed (MLX runs on the GPU)"
    if os.environ.get("MLXCEL_NO_KERNEL"):
        return None, "turned off by MLXCEL_NO_KERNEL"
    asked = os.environ.get("MLXCEL_KERNEL_ISA", "").strip().lower()
    if asked and asked not in KERNEL_ISAS:
        raise UsageError(
            f"MLXCEL_KERNEL_ISA={asked!r} is not one of {', '.join(KERNEL_ISAS)}",
            hint="unset it to use the best kernel this CPU runs",
        )
    if asked == "f32":
        return None, "turned off by MLXCEL_KERNEL_ISA=f32"
    try:
        from . import _qmm  # type: ignore[attr-defined]
    except ImportError as exc:
        note = Path(__file__).with_name("KERNEL_NOT_BUILT")  # setup.py's reason, when the build failed
        why = note.read_text().strip() if note.is_file() else (str(exc).splitlines()[0] if str(exc) else "ImportError")
        return None, f"not built ({why}; reinstall with a C++ compiler and CMake)"
    if asked and not _qmm.set_isa(asked):
        return None, f"MLXCEL_KERNEL_ISA={asked}: this CPU lacks {_ISA_NAMES[asked]}"
    if not asked and not any(_qmm.set_isa(isa) for isa in KERNEL_ISAS[:-1]):
        return None, "this CPU lacks AVX2 (and AVX-512 VNNI)"
    name = f"row-exact {_ISA_NAMES[_qmm.isa()]} kernel"
    if _qmm.isa() == "avxvnni" and _qmm.avxvnni_as_evex():
        name += " (test build: EVEX vpdpbusd)"
    _qmm.set_threads(default_threads())
    if _qmm.set_amx_rows(0 if os.environ.get("MLXCEL_NO_AMX") else AMX_ROWS):
        return _qmm, f"{name}, AMX tiles from {AMX_ROWS} rows"
    return _qmm, name


def default_threads() -> int:
    env = os.environ.get("MLXCEL_KERNEL_THREADS", "").strip()
    if whole_number(env) and int(env) > 0:
        return int(env)
    from .cores import usable_cores

    return usable_cores()  # the affinity mask, within a container's CPU quota


def peak_memory() -> int:
    """MLX's peak memory plus the huge-page arenas (mapped outside MLX's allocator, so its
    counters miss the weights that moved there)."""
    qmm, _ = kernel_status()
    arenas = qmm.huge_pages_bytes() if qmm is not None and hasattr(qmm, "huge_pages_bytes") else 0
    return mx.get_peak_memory() + arenas

"""How many cores this process may run on: its affinity mask, and its cgroup's CPU quota.

Why: the kernels' thread pool spins a worker per thread, and a worker the scheduler cannot run
halves the step (measured here: `MLXCEL_KERNEL_THREADS=2` under `taskset -c 0` gave 86 against
166 tok/s). The affinity mask covers `taskset`; a container limited with `--cpus=1` (cgroup v2
`cpu.max`, v1 `cpu.cfs_quota_us`) keeps every core in its mask but only a core's worth of time, so
the quota counts too, rounded up, the smallest along the cgroup's path, as Go's and Java's
runtimes read it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def affinity_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def quota_cores(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The cgroup CPU quota in cores (rounded up), or None when there is none or it cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2: cpu.max holds "quota period" or "max period"
            for d in _up(root / rel, root):
                limits += _v2(d / "cpu.max")
        elif "cpu" in controllers.split(","):  # cgroup v1
            base = root / controllers if (root / controllers).is_dir() else root / "cpu"
            for d in _up(base / rel, base):
                limits += _v1(d)
    return max(1, math.ceil(min(limits))) if limits else None


def _up(start: Path, top: Path):
    d = start
    while True:
        yield d
        if d == top or top not in d.parents:
            return
        d = d.parent


def _v2(f: Path) -> list[float]:
    try:
        quota, period = f.read_text().split()[:2]
    except (OSError, ValueError):
        return []
    return [] if quota == "max" or float(period) <= 0 else [float(quota) / float(period)]


def _v1(d: Path) -> list[float]:
    try:
        quota = float((d / "cpu.cfs_quota_us").read_text())
        period = float((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return []
    return [] if quota <= 0 or period <= 0 else [quota / period]


def usable_cores() -> int:
    """The affinity mask's cores, no more than the cgroup quota allows."""
    quota = quota_cores()
    return min(affinity_cores(), quota) if quota else affinity_cores()

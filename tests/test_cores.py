"""The kernels' default thread count: the affinity mask, within a container's cgroup CPU quota."""

from __future__ import annotations

from mlxcel_py.cpu import cores


def _tree(tmp_path, files: dict[str, str], cgroup: str):
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    proc = tmp_path / "self-cgroup"
    proc.write_text(cgroup)
    return root, proc


def test_cgroup_v2_quota_is_the_smallest_along_the_path_rounded_up(tmp_path):
    root, proc = _tree(
        tmp_path,
        {"box/cpu.max": "max 100000\n", "box/app/cpu.max": "150000 100000\n"},
        "0::/box/app\n",
    )
    assert cores.quota_cores(root, proc) == 2  # 1.5 cores: two threads, the second part-time
    root, proc = _tree(tmp_path, {"box/cpu.max": "50000 100000\n", "box/app/cpu.max": "max 100000\n"}, "0::/box/app\n")
    assert cores.quota_cores(root, proc) == 1  # the parent's half core limits the child


def test_cgroup_v1_quota_and_no_quota(tmp_path):
    root, proc = _tree(
        tmp_path,
        {"cpu,cpuacct/job/cpu.cfs_quota_us": "100000\n", "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"},
        "4:memory:/x\n2:cpu,cpuacct:/job\n",
    )
    assert cores.quota_cores(root, proc) == 1
    root, proc = _tree(
        tmp_path,
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
        "1:cpu:/\n0::/\n",
    )
    assert cores.quota_cores(root, proc) is None  # -1: no quota (this machine's case)
    assert cores.quota_cores(root, tmp_path / "missing") is None
    root, proc = _tree(tmp_path, {"cpu.max": "garbage\n"}, "0::/\n")
    assert cores.quota_cores(root, proc) is None


def test_usable_cores_is_the_mask_within_the_quota(monkeypatch):
    monkeypatch.setattr(cores, "affinity_cores", lambda: 8)
    monkeypatch.setattr(cores, "quota_cores", lambda: 2)
    assert cores.usable_cores() == 2
    monkeypatch.setattr(cores, "quota_cores", lambda: None)
    assert cores.usable_cores() == 8
    monkeypatch.setattr(cores, "quota_cores", lambda: 16)
    assert cores.usable_cores() == 8

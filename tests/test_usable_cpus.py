"""coursekit.model.usable_cpus: the affinity mask capped by the control group's CPU quota (v1 and v2 layouts, read
from stand-in files), and torch's threads set from it unless OMP_NUM_THREADS decides."""

from __future__ import annotations

import os

import pytest
import torch

from coursekit import model


def _v2(tmp_path, cpu_max):
    (tmp_path / "cg" / "grp").mkdir(parents=True)
    (tmp_path / "cg" / "grp" / "cpu.max").write_text(cpu_max)
    (tmp_path / "proc").write_text("0::/grp\n")
    return tmp_path / "cg", tmp_path / "proc"


@pytest.mark.parametrize("cpu_max,quota", [("150000 100000\n", 1.5), ("max 100000\n", None), ("200000 50000", 4.0)])
def test_v2_quota(tmp_path, cpu_max, quota):
    root, proc = _v2(tmp_path, cpu_max)
    assert model._cgroup_cpu_quota(root, proc) == quota


@pytest.mark.parametrize("quota_us,quota", [("50000", 0.5), ("-1", None)])
def test_v1_quota(tmp_path, quota_us, quota):
    grp = tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc"
    grp.mkdir(parents=True)
    (grp / "cpu.cfs_quota_us").write_text(quota_us + "\n")
    (grp / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "proc").write_text("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    assert model._cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == quota


def test_no_cgroup_file_means_no_quota(tmp_path):
    assert model._cgroup_cpu_quota(tmp_path, tmp_path / "missing") is None


def test_usable_cpus_is_capped_by_the_quota_and_never_below_one(monkeypatch):
    mask = len(os.sched_getaffinity(0))
    monkeypatch.setattr(model, "_cgroup_cpu_quota", lambda: None)
    assert model.usable_cpus() == mask
    monkeypatch.setattr(model, "_cgroup_cpu_quota", lambda: 0.5)
    assert model.usable_cpus() == 1
    monkeypatch.setattr(model, "_cgroup_cpu_quota", lambda: mask + 7.9)
    assert model.usable_cpus() == mask


def test_use_usable_cpus_respects_omp_num_threads(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        monkeypatch.setattr(model, "usable_cpus", lambda: 2)
        assert model.use_usable_cpus() == 1
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert model.use_usable_cpus() == 2 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)

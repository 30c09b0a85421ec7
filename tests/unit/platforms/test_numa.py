"""NUMA pinning from sysfs: fake topologies, and the real affinity of this process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hasten.platforms import numa
from hasten.platforms.registry import get_platform

ALLOWED = frozenset(os.sched_getaffinity(0))


@pytest.fixture(autouse=True)
def _restore_affinity(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(numa, "_allowed_at_start", None)
    monkeypatch.setattr(numa, "_applied", {})
    yield
    os.sched_setaffinity(0, ALLOWED)


def fake_sysfs(root: Path, nodes: dict[int, str], online: str | None = None) -> Path:
    node_dir = root / "devices/system/node"
    node_dir.mkdir(parents=True)
    for node, cpulist in nodes.items():
        (node_dir / f"node{node}").mkdir()
        (node_dir / f"node{node}/cpulist").write_text(cpulist + "\n")
    if online is not None:
        (node_dir / "online").write_text(online + "\n")
    return root


def cpus_text(cpus: list[int]) -> str:
    return ",".join(str(cpu) for cpu in cpus)


def test_parse_cpu_list() -> None:
    assert numa.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert numa.parse_cpu_list("") == []
    assert numa.parse_cpu_list("5") == [5]


def test_nodes_from_online_file_or_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(numa, "SYSFS_ROOT", fake_sysfs(tmp_path / "a", {0: "0", 1: "1"}, "0-1"))
    assert numa.numa_nodes() == [0, 1]
    monkeypatch.setattr(numa, "SYSFS_ROOT", fake_sysfs(tmp_path / "b", {0: "0", 2: "1"}))
    assert numa.numa_nodes() == [0, 2]
    assert numa.numa_cpus(2) == [1] and numa.numa_cpus(7) == []
    monkeypatch.setattr(numa, "SYSFS_ROOT", tmp_path / "missing")
    assert numa.numa_nodes() == [0]


def test_cpu_only_host_pins_process_i_to_node_i_mod_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = sorted(ALLOWED)
    if len(allowed) < 2:
        pytest.skip("needs two usable CPUs")
    first, second = allowed[:1], allowed[1:]
    monkeypatch.setattr(
        numa, "SYSFS_ROOT", fake_sysfs(tmp_path, {0: cpus_text(first), 1: cpus_text(second)}, "0-1")
    )
    numa.override_numa_affinity(0)
    assert os.sched_getaffinity(0) == set(first)
    numa.override_numa_affinity(1)
    assert os.sched_getaffinity(0) == set(second)
    numa.override_numa_affinity(2)  # 2 mod 2 nodes -> node 0
    assert os.sched_getaffinity(0) == set(first)


def test_set_numa_affinity_is_cached_per_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = sorted(ALLOWED)
    monkeypatch.setattr(numa, "SYSFS_ROOT", fake_sysfs(tmp_path, {0: cpus_text(allowed[:1])}, "0"))
    numa.set_numa_affinity(0)
    assert os.sched_getaffinity(0) == set(allowed[:1])
    os.sched_setaffinity(0, ALLOWED)
    numa.set_numa_affinity(0)  # cached: not re-applied
    assert os.sched_getaffinity(0) == ALLOWED
    numa.override_numa_affinity(0)  # recomputed
    assert os.sched_getaffinity(0) == set(allowed[:1])


def test_node_outside_allowed_cpus_leaves_affinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    foreign = max(ALLOWED) + 1000
    monkeypatch.setattr(numa, "SYSFS_ROOT", fake_sysfs(tmp_path, {0: str(foreign)}, "0"))
    numa.override_numa_affinity(0)
    assert os.sched_getaffinity(0) == ALLOWED
    assert "has no CPU this process may use" in caplog.text


def test_verbose_logs_the_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="hasten.utils.environment")  # Accelerate's logger name
    monkeypatch.setattr(
        numa, "SYSFS_ROOT", fake_sysfs(tmp_path, {0: cpus_text(sorted(ALLOWED))}, "0")
    )
    numa.override_numa_affinity(0, verbose=False)
    assert "Assigning" not in caplog.text
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    numa.override_numa_affinity(0)
    assert f"Assigning {len(ALLOWED)} cpu cores to process 0: " in caplog.text  # Accelerate's words


def test_gpu_uses_the_numa_node_of_its_pci_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = sorted(ALLOWED)
    if len(allowed) < 2:
        pytest.skip("needs two usable CPUs")
    root = fake_sysfs(tmp_path, {0: cpus_text(allowed[:1]), 1: cpus_text(allowed[1:])}, "0-1")
    for address, node in (("0000:3b:00.0", "1"), ("0000:86:00.0", "0"), ("0000:99:00.0", "-1")):
        (root / "bus/pci/devices" / address).mkdir(parents=True)
        (root / "bus/pci/devices" / address / "numa_node").write_text(node + "\n")
    monkeypatch.setattr(numa, "SYSFS_ROOT", root)
    cuda = get_platform("cuda")
    addresses = ["0000:3B:00.0", "0000:86:00.0", "0000:99:00.0"]
    monkeypatch.setattr(numa, "current_platform", lambda: cuda)
    monkeypatch.setattr(type(cuda), "device_count", lambda self: 3)
    monkeypatch.setattr(type(cuda), "pci_bus_id", lambda self, index: addresses[index])
    assert numa.get_numa_node_for_device(0) == 1
    assert numa.get_numa_node_for_device(2) is None  # -1: no affinity information
    numa.override_numa_affinity(0)  # GPU 0 sits on node 1
    assert os.sched_getaffinity(0) == set(allowed[1:])
    numa.override_numa_affinity(1)  # GPU 1 sits on node 0
    assert os.sched_getaffinity(0) == set(allowed[:1])
    numa.override_numa_affinity(2)  # unknown node: CPU rule, 2 mod 2 -> node 0
    assert os.sched_getaffinity(0) == set(allowed[:1])


def test_cpu_platform_has_no_device_node() -> None:
    assert numa.get_numa_node_for_device(0) is None


def test_real_topology_pins_within_allowed_cpus() -> None:
    numa.set_numa_affinity(0)
    pinned = os.sched_getaffinity(0)
    assert pinned and pinned <= ALLOWED
    assert pinned == set(numa.numa_cpus(numa.numa_nodes()[0])) & ALLOWED

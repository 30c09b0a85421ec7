"""Pin each process to the CPU cores of the NUMA node nearest to its device.

The topology comes from Linux sysfs, so no vendor library is needed:

- with a GPU: the device's PCI address -> ``/sys/bus/pci/devices/<addr>/numa_node`` ->
  ``/sys/devices/system/node/node<N>/cpulist``;
- on a CPU-only host: local process ``i`` goes to NUMA node ``i mod <number of nodes>``, so
  processes spread evenly over the sockets.

Only CPUs this process was allowed to use when hasten first looked are ever chosen (a cgroup
or ``taskset`` limit is respected). `SYSFS_ROOT` can point at a fake tree for tests.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hasten.config import envvars
from hasten.platforms.registry import current_platform

__all__ = [
    "SYSFS_ROOT",
    "get_numa_node_for_device",
    "numa_cpus",
    "numa_nodes",
    "override_numa_affinity",
    "parse_cpu_list",
    "set_numa_affinity",
]

# Named after Accelerate's module for these messages (accelerate.utils.environment), which its
# tests and users' logging filters name; hasten.utils.environment is that path here.
logger = logging.getLogger("hasten.utils.environment")

SYSFS_ROOT = Path("/sys")

# CPUs allowed when hasten first looked: pinning chooses inside this set, so a second
# override for another index is not limited by the first pin.
_allowed_at_start: frozenset[int] | None = None
# local_process_index -> CPUs applied by set_numa_affinity (its per-process cache).
_applied: dict[int, frozenset[int]] = {}


def parse_cpu_list(text: str) -> list[int]:
    """Parse a sysfs CPU list such as ``"0-3,8,10-11"`` into sorted CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def numa_nodes() -> list[int]:
    """Return the online NUMA node numbers of this host (``[0]`` when sysfs says nothing)."""
    online = SYSFS_ROOT / "devices/system/node/online"
    if online.is_file():
        return parse_cpu_list(online.read_text())
    node_dir = SYSFS_ROOT / "devices/system/node"
    nodes = sorted(
        int(path.name[4:]) for path in node_dir.glob("node[0-9]*") if path.name[4:].isdigit()
    )
    return nodes or [0]


def numa_cpus(node: int) -> list[int]:
    """Return the CPUs of NUMA node `node` (empty when sysfs has no such node)."""
    cpulist = SYSFS_ROOT / f"devices/system/node/node{node}/cpulist"
    return parse_cpu_list(cpulist.read_text()) if cpulist.is_file() else []


def get_numa_node_for_device(device_index: int) -> int | None:
    """Return the NUMA node of accelerator `device_index`, or None if unknown (or on CPU)."""
    address = current_platform().pci_bus_id(device_index)
    if address is None:
        return None
    path = SYSFS_ROOT / "bus/pci/devices" / address.lower() / "numa_node"
    if not path.is_file():
        return None
    node = int(path.read_text().strip())
    return node if node >= 0 else None


def _allowed_cpus() -> frozenset[int]:
    global _allowed_at_start
    if _allowed_at_start is None:
        _allowed_at_start = frozenset(os.sched_getaffinity(0))
    return _allowed_at_start


def _target_node(local_process_index: int) -> int:
    count = max(current_platform().device_count(), 1)
    node = get_numa_node_for_device(local_process_index % count)
    if node is not None:
        return node
    nodes = numa_nodes()
    return nodes[local_process_index % len(nodes)]


def _apply(local_process_index: int, verbose: bool | None) -> frozenset[int]:
    if verbose is None:
        verbose = bool(envvars.setting("ACCELERATE_DEBUG_MODE"))
    allowed = _allowed_cpus()
    node = _target_node(local_process_index)
    cpus = frozenset(numa_cpus(node)) & allowed
    if not cpus:
        # The node's cores are all outside our cgroup/taskset: pinning would fail with EINVAL,
        # and keeping the current set is the only valid choice.
        logger.warning(
            "NUMA node %d has no CPU this process may use (allowed: %s); affinity unchanged.",
            node,
            sorted(allowed),
        )
        return frozenset(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus)
    if verbose:
        logger.info(
            "Assigning %d cpu cores to process %d: %s (NUMA node %d)",
            len(cpus),
            local_process_index,
            sorted(cpus),
            node,
        )
    return cpus


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Recompute and set this process's CPU affinity from the machine's NUMA topology.

    Args:
        local_process_index: index of this process on this machine.
        verbose: log the chosen cores; defaults to ``ACCELERATE_DEBUG_MODE``.
    """
    _applied[local_process_index] = _apply(local_process_index, verbose)


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to its NUMA node's cores, once: later calls with the same index are free.

    Use `override_numa_affinity` to recompute.

    Args:
        local_process_index: index of this process on this machine.
        verbose: log the chosen cores; defaults to ``ACCELERATE_DEBUG_MODE``.
    """
    if local_process_index not in _applied:
        override_numa_affinity(local_process_index, verbose)

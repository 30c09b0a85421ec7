"""Infer the machine topology of a job started with ``srun`` inside a SLURM allocation.

Each node runs one `hasten launch` (one SLURM task per node); SLURM tells every task how many
nodes there are, which one it is, and the node list whose first host becomes the main process.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["expand_nodelist", "first_host", "slurm_topology"]

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top_level(nodelist: str) -> list[str]:
    """Split a SLURM node list on the commas that are not inside ``[...]``."""
    items: list[str] = []
    depth = 0
    current = ""
    for char in nodelist:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def _expand_range(spec: str, nodelist: str) -> list[str]:
    """Expand ``01-03,07`` to ``['01', '02', '03', '07']``, keeping zero padding."""
    values: list[str] = []
    for part in spec.split(","):
        start, _, stop = part.strip().partition("-")
        if not start.isdigit() or (stop and not stop.isdigit()):
            raise ValueError(
                f"Cannot parse the range {part!r} in SLURM node list {nodelist!r}: expected "
                "numbers like 'node[01-04,07]'. Check SLURM_JOB_NODELIST or pass --main_process_ip."
            )
        width = len(start)
        values.extend(str(n).zfill(width) for n in range(int(start), int(stop or start) + 1))
    return values


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM node list such as ``node[01-03],gpu7`` into host names, in order.

    Raises:
        ValueError: the list is empty or a bracket range is malformed.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        expanded = [""]
        pos = 0
        for match in _BRACKET.finditer(item):
            prefix = item[pos : match.start()]
            expanded = [
                head + prefix + value
                for head in expanded
                for value in _expand_range(match.group(1), nodelist)
            ]
            pos = match.end()
        hosts.extend(head + item[pos:] for head in expanded)
    if not hosts:
        raise ValueError(
            f"SLURM node list {nodelist!r} names no host. Check SLURM_JOB_NODELIST or pass "
            "--main_process_ip."
        )
    return hosts


def first_host(nodelist: str) -> str:
    """Return the first host of a SLURM node list (``node[01-04]`` -> ``node01``)."""
    return expand_nodelist(nodelist)[0]


def slurm_topology(environ: Mapping[str, str]) -> dict[str, Any]:
    """Return num_machines, machine_rank and main_process_ip from SLURM's variables.

    Only a task started with ``srun`` inside an allocation (``SLURM_JOB_ID`` and
    ``SLURM_PROCID`` set) yields values; anything else returns ``{}`` so the other sources apply.
    """
    if not environ.get("SLURM_JOB_ID") or environ.get("SLURM_PROCID") is None:
        return {}
    found: dict[str, Any] = {}
    nnodes = environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES")
    if nnodes:
        found["num_machines"] = int(nnodes)
    node_id = environ.get("SLURM_NODEID")
    if node_id is not None:
        found["machine_rank"] = int(node_id)
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if nodelist:
        found["main_process_ip"] = first_host(nodelist)
    return found

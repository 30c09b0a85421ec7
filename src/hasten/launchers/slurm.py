"""Infer the machine topology of a job started with ``srun`` inside a SLURM allocation.

Each node runs one `hasten launch` (one SLURM task per node); SLURM tells every task how many
nodes there are, which one it is, and the node list whose first host becomes the main process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hasten.core.hostlist import expand_nodelist, first_host

__all__ = ["expand_nodelist", "first_host", "slurm_topology"]


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

"""Where ranks come from: the variables each kind of launcher sets, read from a mapping.

torchrun / torch elastic (and `hasten launch`, built on it; Kubernetes' PyTorchJob sets the
same) set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. SLURM's
``srun`` starts one task per process and tells each its place (SLURM_PROCID, SLURM_LOCALID,
SLURM_STEP_NUM_TASKS, the node list). MPI launchers set their own names (MPICH and Intel MPI:
PMI_*; Open MPI: OMPI_COMM_WORLD_*; MVAPICH2: MV2_COMM_WORLD_*). Every function here is pure:
it reads the mapping it is given, never the process environment.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from hasten.config import envvars

__all__ = [
    "MPI_FAMILIES",
    "RankInfo",
    "find_ranks",
    "ranks_from_mpi",
    "ranks_from_slurm",
    "ranks_from_torchrun",
    "slurm_port",
]


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, as a launcher described it."""

    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"{self.source} set rank={self.rank} and world size={self.world_size}; a rank must "
                "lie in [0, world size). Check the launcher's rank variables."
            )
        if self.local_rank < 0:
            raise ValueError(
                f"{self.source} set local rank={self.local_rank}; it must be >= 0. "
                "Check the launcher's local-rank variable."
            )


# (rank, size, local rank, local size) variable names per MPI implementation.
MPI_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    (
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
)


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = envvars.setting(name, env)
    return None if value is None else int(value)


def ranks_from_torchrun(env: Mapping[str, str]) -> RankInfo | None:
    """Return the ranks torchrun set, or None when LOCAL_RANK and RANK are both absent."""
    local_rank = _int(env, "LOCAL_RANK")
    rank = _int(env, "RANK")
    if local_rank is None and rank is None:
        return None
    world_size = _int(env, "WORLD_SIZE") or 1
    local_world_size = _int(env, "LOCAL_WORLD_SIZE")
    if rank is None:
        rank = local_rank or 0
    if local_rank is None:
        # No LOCAL_RANK: a single-machine job started by hand with RANK/WORLD_SIZE only.
        local_rank = rank
    return RankInfo(
        source="torchrun",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size or world_size,
        master_addr=envvars.setting("MASTER_ADDR", env),
        master_port=_int(env, "MASTER_PORT"),
    )


def ranks_from_mpi(env: Mapping[str, str]) -> RankInfo | None:
    """Return the ranks an MPI launcher set (first family found), or None for a single process."""
    for rank_var, size_var, local_rank_var, local_size_var in MPI_FAMILIES:
        size = _int(env, size_var)
        if size is None or size <= 1:
            continue
        rank = _int(env, rank_var) or 0
        local_size = _int(env, local_size_var) or size
        local_rank = _int(env, local_rank_var)
        return RankInfo(
            source="mpi",
            rank=rank,
            world_size=size,
            local_rank=rank % local_size if local_rank is None else local_rank,
            local_world_size=local_size,
            master_addr=envvars.setting("MASTER_ADDR", env),
            master_port=_int(env, "MASTER_PORT"),
        )
    return None


# SLURM's ids for steps that are not srun's: the batch script's and the allocation's own.
_NOT_SRUN_STEPS = frozenset({"batch", "extern", "interactive", "4294967294", "4294967295"})
_TASKS_PER_NODE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _tasks_on_node(tasks_per_node: str | None, node: int) -> int | None:
    """Tasks on node ``node`` from SLURM's compressed ``2(x3),1`` (None if it cannot tell)."""
    if not tasks_per_node:
        return None
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = _TASKS_PER_NODE.match(part.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if 0 <= node < len(counts) else None


def slurm_port(job_id: int | None) -> int:
    """The rendezvous port of a SLURM job without MASTER_PORT: 20000-29999 by job id, the same
    for every task of the job and rarely the same for two jobs sharing a node."""
    return 20000 + (job_id or 0) % 10000


def ranks_from_slurm(env: Mapping[str, str]) -> RankInfo | None:
    """Return the ranks of a task ``srun`` started, or None outside an srun step of >1 task.

    The rank is SLURM_PROCID, the local rank SLURM_LOCALID, the world size the step's task count;
    unless MASTER_ADDR/MASTER_PORT are set, the rendezvous is the step's first node, on a port
    chosen from the job id (`slurm_port`). A batch script's own shell is not an srun step: a
    ``python train.py`` there runs as one process.
    """
    step = envvars.setting("SLURM_STEP_ID", env)
    rank = _int(env, "SLURM_PROCID")
    if step is None or step in _NOT_SRUN_STEPS or rank is None:
        return None
    size = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS")
    if size is None or size <= 1:
        return None
    local_rank = _int(env, "SLURM_LOCALID") or 0
    node = _int(env, "SLURM_NODEID") or 0
    per_node = envvars.setting("SLURM_STEP_TASKS_PER_NODE", env) or envvars.setting(
        "SLURM_TASKS_PER_NODE", env
    )
    nodelist = (
        envvars.setting("SLURM_STEP_NODELIST", env)
        or envvars.setting("SLURM_JOB_NODELIST", env)
        or envvars.setting("SLURM_NODELIST", env)
    )
    master = envvars.setting("MASTER_ADDR", env)
    if master is None and nodelist:
        from hasten.core.hostlist import first_host  # only srun tasks parse a node list

        master = first_host(nodelist)
    return RankInfo(
        source="slurm",
        rank=rank,
        world_size=size,
        local_rank=local_rank,
        local_world_size=_tasks_on_node(per_node, node) or size,
        master_addr=master,
        master_port=_int(env, "MASTER_PORT") or slurm_port(_int(env, "SLURM_JOB_ID")),
    )


def find_ranks(env: Mapping[str, str]) -> RankInfo | None:
    """Return the ranks of this process: torchrun's variables, else SLURM's, else MPI's, else None."""
    return ranks_from_torchrun(env) or ranks_from_slurm(env) or ranks_from_mpi(env)

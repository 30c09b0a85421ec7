"""Decide what kind of run this is: a pure function of (environment, platform, cpu flag).

`detect_run` is the only place that turns launcher variables and hardware into a
`DistributedType`, a backend and ranks; `PartialState` acts on its answer. Keeping it pure makes
every combination testable without processes or devices.

Unlike Accelerate, a multi-process launch on a host without accelerators is MULTI_CPU over gloo
without ``cpu=True`` (Accelerate silently runs N independent single processes there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from hasten.config import envvars
from hasten.config.enums import DistributedType, SageMakerDistributedType
from hasten.platforms.base import Platform
from hasten.state.environments import RankInfo, find_ranks

__all__ = [
    "CPU_BACKENDS",
    "DEFAULT_MASTER_PORT",
    "RunSpec",
    "detect_run",
    "main_is_last_process",
    "runs_distributed",
]

# Backends torch.distributed offers for CPU tensors (ccl: Intel oneCCL bindings).
CPU_BACKENDS = ("gloo", "mpi", "ccl")
DEFAULT_MASTER_PORT = 29500
_LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything `PartialState` needs to set itself up, decided once.

    Attributes:
        distributed_type: the run's label (NO, MULTI_CPU, MULTI_GPU, ..., DEEPSPEED).
        backend: the torch.distributed backend, or None for a single process.
        num_processes: processes in the job.
        process_index: this process's global index.
        local_process_index: this process's index on its machine.
        local_num_processes: processes on this machine.
        device_type: torch device type this process computes on.
        cpu: the run was forced onto the CPU (``cpu=True`` or ``ACCELERATE_USE_CPU``).
        use_deepspeed: the process group is created through ``deepspeed.comm``.
        source: who launched us: "torchrun", "mpi" or "none".
        env_updates: variables to set before creating the process group (``env://`` reads them).
    """

    distributed_type: DistributedType
    backend: str | None
    num_processes: int = 1
    process_index: int = 0
    local_process_index: int = 0
    local_num_processes: int = 1
    device_type: str = "cpu"
    cpu: bool = False
    use_deepspeed: bool = False
    source: str = "none"
    env_updates: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def __getstate__(self) -> dict[str, object]:
        # A mappingproxy cannot be pickled; the spec is pickled with its PartialState.
        state = dict(self.__dict__)
        state["env_updates"] = dict(self.env_updates)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "env_updates", MappingProxyType(dict(self.env_updates)))

    @property
    def needs_process_group(self) -> bool:
        """Whether a torch.distributed process group must exist for this run."""
        return self.backend is not None


def _cpu_backend(requested: str | None, ranks: RankInfo, mpi_available: bool) -> str:
    if requested is None:
        return "mpi" if ranks.source == "mpi" and mpi_available else "gloo"
    if requested not in CPU_BACKENDS:
        raise ValueError(
            f"backend={requested!r} cannot join CPU processes; use one of {list(CPU_BACKENDS)} "
            "(or drop `backend` and hasten picks gloo)."
        )
    return requested


def _rendezvous_env(ranks: RankInfo, backend: str) -> dict[str, str]:
    """Variables ``init_process_group(init_method="env://")`` needs, for MPI and SLURM launches."""
    if ranks.source not in ("mpi", "slurm"):
        return {}
    updates = {
        "RANK": str(ranks.rank),
        "WORLD_SIZE": str(ranks.world_size),
        "LOCAL_RANK": str(ranks.local_rank),
        "LOCAL_WORLD_SIZE": str(ranks.local_world_size),
        "MASTER_PORT": str(ranks.master_port or DEFAULT_MASTER_PORT),
    }
    if ranks.master_addr:
        updates["MASTER_ADDR"] = ranks.master_addr
    elif ranks.local_world_size == ranks.world_size or backend == "mpi":
        updates["MASTER_ADDR"] = _LOOPBACK
    else:
        raise ValueError(
            f"An {ranks.source.upper()} launch spans several machines ({ranks.world_size} "
            f"processes, {ranks.local_world_size} on this one) but MASTER_ADDR is not set. Export "
            "the hostname of rank 0 as MASTER_ADDR on every machine."
        )
    return updates


def _fsdp_needs_cpu_group(env: Mapping[str, str]) -> bool:
    # FSDP offload and full state dicts move tensors through CPU collectives, so the group
    # needs a gloo half next to the device backend.
    if not envvars.setting("ACCELERATE_USE_FSDP", env):
        return False
    state_dict_type = envvars.setting("FSDP_STATE_DICT_TYPE", env) or "SHARDED_STATE_DICT"
    return bool(envvars.setting("FSDP_OFFLOAD_PARAMS", env)) or state_dict_type == (
        "FULL_STATE_DICT"
    )


def _uses_sagemaker_dp(env: Mapping[str, str]) -> bool:
    return bool(envvars.setting("ACCELERATE_USE_SAGEMAKER", env)) and (
        envvars.setting("ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE", env) != SageMakerDistributedType.NO
    )


def detect_run(
    env: Mapping[str, str],
    platform: Platform,
    cpu: bool = False,
    *,
    backend: str | None = None,
    mpi_available: bool = False,
) -> RunSpec:
    """Decide distributed type, backend and ranks from launcher variables and the platform.

    Args:
        env: the environment to read (``hasten.config.envvars.snapshot()`` in real use).
        platform: the hardware family of this host (`hasten.platforms.current_platform()`).
        cpu: force the CPU even when an accelerator is present.
        backend: a backend the user asked for (``InitProcessGroupKwargs(backend=...)``).
        mpi_available: whether torch.distributed was built with MPI.

    Raises:
        ValueError: the requested backend cannot serve this platform, or the rank variables
            are inconsistent.
    """
    cpu = cpu or bool(envvars.setting("ACCELERATE_USE_CPU", env))
    ranks = find_ranks(env)
    if ranks is not None and ranks.world_size == 1 and not ranks.master_addr:
        # A stray RANK/LOCAL_RANK (left by a tool or a parent job) with no rendezvous address:
        # nothing to join, so run as one process rather than fail in init_process_group.
        ranks = None
    on_cpu = cpu or platform.distributed_type == DistributedType.MULTI_CPU
    if ranks is None:
        return RunSpec(
            DistributedType.NO, None, device_type="cpu" if cpu else platform.device_type, cpu=cpu
        )
    common = {
        "num_processes": ranks.world_size,
        "process_index": ranks.rank,
        "local_process_index": ranks.local_rank,
        "local_num_processes": ranks.local_world_size,
        "cpu": cpu,
        "source": ranks.source,
    }
    if on_cpu:
        chosen = _cpu_backend(backend, ranks, mpi_available)
        return RunSpec(
            DistributedType.MULTI_CPU,
            chosen,
            device_type="cpu",
            env_updates=MappingProxyType(_rendezvous_env(ranks, chosen)),
            **common,  # type: ignore[arg-type]
        )
    distributed_type = platform.distributed_type
    if _uses_sagemaker_dp(env):
        chosen = "smddp"
        distributed_type = DistributedType.MULTI_GPU
    else:
        chosen = backend or platform.dist_backend
        if backend is None and _fsdp_needs_cpu_group(env):
            chosen = f"{platform.device_type}:{chosen},cpu:gloo"
    use_deepspeed = bool(envvars.setting("ACCELERATE_USE_DEEPSPEED", env))
    return RunSpec(
        DistributedType.DEEPSPEED if use_deepspeed else distributed_type,
        chosen,
        device_type=platform.device_type,
        use_deepspeed=use_deepspeed,
        env_updates=MappingProxyType(_rendezvous_env(ranks, chosen)),
        **common,  # type: ignore[arg-type]
    )


def runs_distributed(distributed_type: DistributedType) -> bool:
    """Return whether this label means several cooperating processes (anything but NO)."""
    return distributed_type != DistributedType.NO


def main_is_last_process(distributed_type: DistributedType) -> bool:
    """Return whether the last process plays "main" (Megatron-LM logs from the last stage)."""
    return distributed_type == DistributedType.MEGATRON_LM

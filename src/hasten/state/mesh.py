"""The job's one `DeviceMesh`, built once from a `ParallelismConfig` (N-D parallelism).

`resolve_parallelism_config` turns the user's arguments (a `ParallelismConfig`, the deprecated
`TorchTensorParallelPlugin`, or ``ACCELERATE_USE_PARALLELISM_CONFIG`` written by `hasten launch`)
into one config; `build_device_mesh` checks it against the job and the engine and builds the mesh
with Accelerate's dimension names (``dp_replicate``, ``dp_shard``, ``cp``, ``tp`` and the
flattened ``dp``, ``dp_shard_cp``, ``dp_cp``). `AcceleratorState` stores the result.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from hasten.config import envvars

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hasten.config.parallelism import ParallelismConfig

__all__ = [
    "TP_PLUGIN_DEPRECATION",
    "build_device_mesh",
    "data_parallel_share",
    "mesh_local_rank",
    "mesh_size",
    "resolve_parallelism_config",
    "submesh",
]

#: Accelerate's deprecation message for the older tensor-parallel plugin.
TP_PLUGIN_DEPRECATION = (
    "`TorchTensorParallelPlugin` is deprecated and will be removed in a future version of "
    "Accelerate. Please use the `ParallelismConfig` with `tp_size` instead."
)


def resolve_parallelism_config(parallelism_config: Any, torch_tp_plugin: Any) -> Any:
    """Return the `ParallelismConfig` of this run (None when nothing asks for one).

    A `TorchTensorParallelPlugin` becomes ``ParallelismConfig(tp_size=plugin.tp_size)`` with a
    FutureWarning; ``ACCELERATE_USE_PARALLELISM_CONFIG`` builds one from the
    ``PARALLELISM_CONFIG_*`` variables.

    Raises:
        ValueError: the plugin and the config ask for different tensor-parallel sizes.
    """
    from_env = parallelism_config is None and envvars.read_flag("ACCELERATE_USE_PARALLELISM_CONFIG")
    if torch_tp_plugin is None and not from_env:
        return parallelism_config  # nothing to build: the config module is not even loaded
    from hasten.config.parallelism import ParallelismConfig

    if from_env:
        parallelism_config = ParallelismConfig()
    if torch_tp_plugin is None:
        return parallelism_config
    warnings.warn(TP_PLUGIN_DEPRECATION, FutureWarning, stacklevel=3)
    tp_size = int(getattr(torch_tp_plugin, "tp_size", 1))
    if parallelism_config is None:
        return ParallelismConfig(tp_size=tp_size)
    if parallelism_config.tp_size not in (1, tp_size):
        raise ValueError(
            f"torch_tp_plugin has tp_size={tp_size} but parallelism_config has "
            f"tp_size={parallelism_config.tp_size}; pass only parallelism_config "
            "(TorchTensorParallelPlugin is deprecated)"
        )
    if parallelism_config.tp_size == 1 and tp_size > 1:
        parallelism_config = ParallelismConfig(
            dp_replicate_size=parallelism_config.dp_replicate_size,
            dp_shard_size=parallelism_config.dp_shard_size,
            tp_size=tp_size,
            cp_size=parallelism_config.cp_size,
            cp_handler=parallelism_config.cp_handler,
        )
    return parallelism_config


def _check_deepspeed(config: ParallelismConfig) -> None:
    """DeepSpeed takes data parallelism (ZeRO shards over every process) and its own Ulysses
    sequence parallelism (sp_size), nothing else."""
    refused = [
        f"{dim}_size={getattr(config, f'{dim}_size')}"
        for dim in ("tp", "cp")
        if getattr(config, f"{dim}_enabled")
    ]
    if refused:
        raise ValueError(
            f"ParallelismConfig({', '.join(refused)}) cannot be used with DeepSpeed: hasten's "
            "DeepSpeed engine takes data-parallel dimensions and DeepSpeed's own sequence "
            "parallelism (sp_size) from ParallelismConfig. Use FSDP2 (fsdp_plugin) for "
            "tensor/context parallelism, or set these sizes to 1."
        )
    if config.dp_replicate_enabled and config.dp_shard_enabled:
        raise ValueError(
            f"ParallelismConfig(dp_replicate_size={config.dp_replicate_size}, dp_shard_size="
            f"{config.dp_shard_size}) cannot be used with DeepSpeed: ZeRO shards over every "
            "process, so a replicate x shard (HSDP) layout would be ignored. Use FSDP2 for HSDP, "
            "or give DeepSpeed one data-parallel dimension."
        )


def _check_engine(config: ParallelismConfig, *, is_fsdp2: bool, deepspeed: bool) -> None:
    """Refuse dimensions the chosen engine cannot honour (never silently train DDP instead)."""
    if deepspeed:
        _check_deepspeed(config)
        return
    if config.sp_enabled:
        raise ValueError(
            f"ParallelismConfig(sp_size={config.sp_size}) needs DeepSpeed (sp_backend="
            "'deepspeed', Ulysses sequence parallelism); pass a deepspeed_plugin, or use "
            "cp_size for context parallelism with FSDP2"
        )
    if config.dp_shard_enabled and not is_fsdp2:
        raise ValueError(
            f"ParallelismConfig(dp_shard_size={config.dp_shard_size}) shards parameters with "
            "FSDP2, but FSDP2 is not enabled; pass "
            "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) (or hasten launch "
            "--use_fsdp --fsdp_version 2), or use dp_replicate_size for plain data parallelism"
        )


def build_device_mesh(
    config: ParallelismConfig | None,
    *,
    num_processes: int,
    device_type: str,
    multi_device: bool,
    is_fsdp2: bool = False,
    deepspeed: bool = False,
) -> DeviceMesh | None:
    """Check ``config`` against the job and build its mesh (None without a config).

    Raises:
        ValueError: context parallelism on the CPU, sizes that do not multiply to the number
            of processes, or a dimension the engine (DDP, FSDP2, DeepSpeed) cannot honour.
    """
    if config is None:
        return None
    if config.cp_enabled and device_type == "cpu":
        raise ValueError(
            f"ParallelismConfig(cp_size={config.cp_size}): context parallelism needs a GPU; "
            "torch's context_parallel has no sharding strategy for the CPU attention kernels. "
            "Run on CUDA devices, or set cp_size=1."
        )
    _check_engine(config, is_fsdp2=is_fsdp2, deepspeed=deepspeed)
    if config.total_size != 1 and config.total_size != num_processes and not config.sp_enabled:
        sizes = " x ".join(
            f"{dim}_size={getattr(config, f'{dim}_size')}"
            for dim in ("dp_replicate", "dp_shard", "tp", "cp", "sp")
        )
        raise ValueError(
            f"ParallelismConfig sizes multiply to {config.total_size} ({sizes}), but the job has "
            f"{num_processes} process(es); make the product equal the number of processes "
            f"(e.g. launch with --num_processes {config.total_size})"
        )
    for warning in config.validate_for(
        num_processes, multi_device=multi_device, is_fsdp2=is_fsdp2, is_deepspeed=deepspeed
    ):
        warnings.warn(warning, UserWarning, stacklevel=3)
    if config.total_size == 1:
        return None
    return config.get_device_mesh(device_type)


def submesh(mesh: DeviceMesh | None, name: str) -> DeviceMesh | None:
    """The 1-D mesh of dimension ``name``, flattened ones included (None when absent).

    Flattened views are read from the root mesh's bookkeeping: slicing them with
    ``mesh["dp"]`` works too but warns about a deprecation in recent torch.
    """
    if mesh is None:
        return None
    flattened = getattr(mesh, "_flatten_mapping", None) or {}
    if name in flattened:
        return flattened[name]
    if name in (mesh.mesh_dim_names or ()):
        return mesh[name]
    return None


def mesh_size(mesh: DeviceMesh | None, name: str) -> int:
    """Size of mesh dimension ``name`` (1 when the mesh lacks it or there is no mesh)."""
    sub = submesh(mesh, name)
    return 1 if sub is None else int(sub.size())


def mesh_local_rank(mesh: DeviceMesh | None, name: str) -> int:
    """This process's coordinate along ``name`` (0 when the mesh lacks it)."""
    sub = submesh(mesh, name)
    return 0 if sub is None else int(sub.get_local_rank())


def data_parallel_share(mesh: Any, num_processes: int, process_index: int) -> tuple[int, int]:
    """(number of data-parallel replicas, the replica of process ``process_index``) on ``mesh``.

    Only data-parallel ranks split the data: processes of one tensor/context-parallel group get
    the same batches. Those dimensions are the innermost of a mesh built from a
    `ParallelismConfig` (as in Accelerate), so consecutive process indices share a replica.
    """
    if mesh is None:
        return num_processes, process_index
    replicas = mesh_size(mesh, "tp") * mesh_size(mesh, "cp") * mesh_size(mesh, "sp")
    names = tuple(mesh.mesh_dim_names or ())
    if "dp_replicate" in names or "dp_shard" in names:
        size = mesh_size(mesh, "dp_replicate") * mesh_size(mesh, "dp_shard")
    else:
        size = max(1, num_processes // replicas)
    return size, process_index // replicas

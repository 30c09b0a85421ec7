"""The one place that maps the run's resolved `EngineChoice` to a `Strategy`.

Called once per Accelerator; every later decision dispatches through the returned object.
"""

from __future__ import annotations

from typing import Any

import torch

from hasten.config.enums import DistributedType
from hasten.state.engine import EngineChoice
from hasten.strategies.base import Strategy
from hasten.strategies.ddp import DDPStrategy, DDPWrapSettings
from hasten.strategies.single import SingleDeviceStrategy
from hasten.strategies.unwired import UnwiredStrategy

__all__ = ["select_strategy"]

# One DDP replica per process on every platform family with a torch.distributed backend.
_DDP_TYPES = frozenset(
    {
        DistributedType.MULTI_CPU,
        DistributedType.MULTI_GPU,
        DistributedType.MULTI_NPU,
        DistributedType.MULTI_MLU,
        DistributedType.MULTI_SDAA,
        DistributedType.MULTI_MUSA,
        DistributedType.MULTI_XPU,
        DistributedType.MULTI_HPU,
    }
)
_UNWIRED_TYPES = {
    DistributedType.MEGATRON_LM: "Megatron-LM",
    DistributedType.XLA: "XLA",
}


def _label(distributed_type: Any) -> DistributedType:
    try:
        return DistributedType(distributed_type)
    except ValueError:
        raise ValueError(
            f"Unknown distributed_type {distributed_type!r}; expected one of "
            f"{[t.value for t in DistributedType]}. Set it through hasten launch or "
            "`hasten config`."
        ) from None


def _fsdp_strategy(plugin: Any, device: torch.device) -> Strategy:
    if plugin is None:
        from hasten.config.fsdp import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin()
    if plugin.fsdp_version == 2:
        from hasten.strategies.fsdp2 import FSDP2Strategy

        return FSDP2Strategy(plugin, device)
    from hasten.strategies.fsdp1 import FSDP1Strategy

    return FSDP1Strategy(plugin, device)


def _fsdp_on_mesh(plugin: Any, device: torch.device, config: Any) -> Strategy | None:
    """FSDP2 over a ParallelismConfig mesh (HSDP, FSDP2 x TP); None without such a mesh."""
    mesh = getattr(config, "device_mesh", None)
    if mesh is None or plugin is None:
        return None
    if plugin.fsdp_version != 2:
        if config.tp_enabled or config.cp_enabled or config.dp_replicate_enabled:
            raise ValueError(
                f"ParallelismConfig dimensions {config.active_mesh_dims} need FSDP2, but the FSDP "
                "plugin has fsdp_version=1; set fsdp_version=2 (--fsdp_version 2)"
            )
        return None
    from hasten.strategies.composable import MeshFSDP2Strategy

    return MeshFSDP2Strategy(plugin, device, mesh, config)


def _tensor_parallel(config: Any) -> Strategy | None:
    """Pure tensor parallelism (tp only, optionally over one replica): hasten's TP strategy."""
    if not getattr(config, "tp_enabled", False):
        return None
    if config.dp_shard_enabled or config.cp_enabled or config.sp_enabled:
        return None  # composed with FSDP2 / context parallelism: the FSDP2 strategy's job
    from hasten.strategies.tensor_parallel import TensorParallelStrategy  # only for tp runs

    return TensorParallelStrategy(config.device_mesh)


def _active_deepspeed_plugin() -> Any:
    from hasten.state import AcceleratorState

    plugin = AcceleratorState().deepspeed_plugin
    if plugin is None:
        raise RuntimeError(
            "No DeepSpeed plugin is active: pass Accelerator(deepspeed_plugin=...) or select "
            "one with AcceleratorState().select_deepspeed_plugin(name) before prepare()."
        )
    return plugin


def select_strategy(
    engine: EngineChoice | DistributedType | str,
    *,
    device: torch.device,
    ddp_kwargs: DDPWrapSettings | None = None,
    parallelism_config: Any = None,
    world_size: int = 1,
) -> Strategy:
    """Pick the strategy for this run.

    Args:
        engine: the run's resolved `EngineChoice` (from `AcceleratorState.engine`), or a bare
            `DistributedType` label (no plugins: FSDP then uses the default plugin).
        device: this process's device; accelerators get ``device_ids=[index]`` for DDP.
        ddp_kwargs: the user's `DistributedDataParallelKwargs`, if any.
        parallelism_config: a `ParallelismConfig`; sharded, tensor, context or sequence
            parallel dimensions select the (not yet wired) composable-parallelism engine.
        world_size: processes in the run (Megatron-LM checks its parallel sizes against it).

    Returns:
        The strategy object the Accelerator dispatches to.

    Raises:
        ValueError: ``engine`` is not a known `DistributedType`, or Megatron-LM sizes that do
            not divide ``world_size``.
    """
    choice = engine if isinstance(engine, EngineChoice) else None
    kind = choice.distributed_type if choice is not None else _label(engine)
    if kind == DistributedType.FSDP:
        plugin = choice.fsdp_plugin if choice is not None else None
        on_mesh = _fsdp_on_mesh(plugin, device, parallelism_config)
        return on_mesh if on_mesh is not None else _fsdp_strategy(plugin, device)
    if kind == DistributedType.MEGATRON_LM and choice is not None:
        from hasten.strategies.megatron import MegatronStrategy

        return MegatronStrategy(choice.megatron_lm_plugin, world_size)
    if kind == DistributedType.DEEPSPEED:
        from hasten.strategies.deepspeed import DeepSpeedStrategy  # only for DeepSpeed runs

        return DeepSpeedStrategy(_active_deepspeed_plugin, "gloo" if device.type == "cpu" else None)
    if kind in _UNWIRED_TYPES:
        return UnwiredStrategy(_UNWIRED_TYPES[kind])
    unused = [n for n in (choice.requested if choice is not None else ()) if n != "fsdp"]
    if unused and choice is not None and choice.name == "none":
        # A DeepSpeed / Megatron-LM request this run cannot honour is refused, never ignored.
        return UnwiredStrategy({"deepspeed": "DeepSpeed", "megatron_lm": "Megatron-LM"}[unused[0]])
    tensor_parallel = _tensor_parallel(parallelism_config)
    if tensor_parallel is not None:
        return tensor_parallel
    beyond_ddp = list(getattr(parallelism_config, "non_dp_dim_names", []))
    if getattr(parallelism_config, "dp_shard_enabled", False):
        beyond_ddp.insert(0, "dp_shard")
    if beyond_ddp:
        return UnwiredStrategy(f"composable parallelism ({', '.join(beyond_ddp)})")
    if kind in _DDP_TYPES:
        device_ids = None if device.type == "cpu" or device.index is None else [device.index]
        return DDPStrategy(device_ids=device_ids, ddp_kwargs=ddp_kwargs)
    return SingleDeviceStrategy()

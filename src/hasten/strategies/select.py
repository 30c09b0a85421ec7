"""The one place that maps the run's resolved `EngineChoice` to a `Strategy`.

Each engine has one builder (`_BUILDERS`, keyed by the run's label): FSDP (the composable
strategy for FSDP2, on the job's mesh when a `ParallelismConfig` built one; FSDP1), DeepSpeed,
Megatron-LM, XLA. Every other label is plain data parallelism (`_data_parallel`): a plugin this
run cannot honour is refused, tensor parallelism alone gets the composable strategy, any other
mesh dimension beyond data parallelism is refused, then DDP or a single device. Called once per
Accelerator; every later decision dispatches through the returned object.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hasten.config.enums import DistributedType
from hasten.state.engine import EngineChoice
from hasten.strategies.base import Strategy
from hasten.strategies.ddp import DDPStrategy, DDPWrapSettings
from hasten.strategies.single import SingleDeviceStrategy
from hasten.strategies.unwired import UnwiredStrategy

if TYPE_CHECKING:
    from hasten.config.parallelism import ParallelismConfig

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


def _label(distributed_type: DistributedType | str) -> DistributedType:
    try:
        return DistributedType(distributed_type)
    except ValueError:
        raise ValueError(
            f"Unknown distributed_type {distributed_type!r}; expected one of "
            f"{[t.value for t in DistributedType]}. Set it through hasten launch or "
            "`hasten config`."
        ) from None


@dataclasses.dataclass(frozen=True)
class _Request:
    """What `select_strategy` was asked, handed to the builder of the run's engine."""

    kind: DistributedType
    choice: EngineChoice | None
    device: torch.device
    ddp_kwargs: DDPWrapSettings | None
    config: ParallelismConfig | None
    world_size: int


def _fsdp(request: _Request) -> Strategy:
    """FSDP2 (the composable strategy, on the job's mesh when there is one) or FSDP1."""
    plugin = request.choice.fsdp_plugin if request.choice is not None else None
    # a bare FSDP label (no EngineChoice) means the default plugin and no mesh
    config = request.config if plugin is not None else None
    mesh = config.device_mesh if config is not None else None
    if config is None or mesh is None:
        config = None
    if plugin is None:
        from hasten.config.fsdp import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin()
    if plugin.fsdp_version == 2:
        from hasten.strategies.composable import ComposableStrategy

        return ComposableStrategy(plugin, request.device, mesh, config)
    if config is not None and (
        config.tp_enabled or config.cp_enabled or config.dp_replicate_enabled
    ):
        raise ValueError(
            f"ParallelismConfig dimensions {config.active_mesh_dims} need FSDP2, but the FSDP "
            "plugin has fsdp_version=1; set fsdp_version=2 (--fsdp_version 2)"
        )
    from hasten.strategies.fsdp1 import FSDP1Strategy

    return FSDP1Strategy(plugin, request.device)


def _deepspeed(request: _Request) -> Strategy:
    from hasten.strategies.deepspeed import DeepSpeedStrategy  # only for DeepSpeed runs

    backend = "gloo" if request.device.type == "cpu" else None
    return DeepSpeedStrategy(_active_deepspeed_plugin, backend)


def _megatron(request: _Request) -> Strategy:
    plugin = request.choice.megatron_lm_plugin if request.choice is not None else None
    if plugin is None:  # a bare label carries no plugin to build the engine from
        return UnwiredStrategy("Megatron-LM")
    from hasten.strategies.megatron import MegatronStrategy

    return MegatronStrategy(plugin, request.world_size)


def _xla(request: _Request) -> Strategy:
    return UnwiredStrategy("XLA")


def _data_parallel(request: _Request) -> Strategy:
    """No engine of its own: a request that cannot be honoured is refused; a tensor-parallel
    mesh gets the composable strategy; otherwise DDP over the processes, or one device."""
    choice, config = request.choice, request.config
    unused = [n for n in (choice.requested if choice is not None else ()) if n != "fsdp"]
    if unused and choice is not None and choice.name == "none":
        # A DeepSpeed / Megatron-LM request this run cannot honour is refused, never ignored.
        return UnwiredStrategy({"deepspeed": "DeepSpeed", "megatron_lm": "Megatron-LM"}[unused[0]])
    beyond_ddp = list(getattr(config, "non_dp_dim_names", []))
    if getattr(config, "dp_shard_enabled", False):
        beyond_ddp.insert(0, "dp_shard")
    tensor_parallel_alone = beyond_ddp == ["tp"] and getattr(config, "tp_enabled", False)
    if config is not None and tensor_parallel_alone:
        from hasten.strategies.composable import ComposableStrategy  # only for tp runs

        return ComposableStrategy(None, request.device, config.device_mesh, config)
    if beyond_ddp:
        return UnwiredStrategy(f"composable parallelism ({', '.join(beyond_ddp)})")
    if request.kind in _DDP_TYPES:
        device = request.device
        device_ids = None if device.type == "cpu" or device.index is None else [device.index]
        return DDPStrategy(device_ids=device_ids, ddp_kwargs=request.ddp_kwargs)
    return SingleDeviceStrategy()


#: The builder of each engine's strategy; every other label is plain data parallelism.
_BUILDERS: dict[DistributedType, Callable[[_Request], Strategy]] = {
    DistributedType.FSDP: _fsdp,
    DistributedType.DEEPSPEED: _deepspeed,
    DistributedType.MEGATRON_LM: _megatron,
    DistributedType.XLA: _xla,
}


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
    parallelism_config: ParallelismConfig | None = None,
    world_size: int = 1,
) -> Strategy:
    """Pick the strategy for this run.

    Args:
        engine: the run's resolved `EngineChoice` (from `AcceleratorState.engine`), or a bare
            `DistributedType` label (no plugins: FSDP then uses the default plugin).
        device: this process's device; accelerators get ``device_ids=[index]`` for DDP.
        ddp_kwargs: the user's `DistributedDataParallelKwargs`, if any.
        parallelism_config: a `ParallelismConfig` whose mesh (`AcceleratorState` builds it)
            the composable strategy parallelizes over: FSDP2 with HSDP and/or tensor
            parallelism, or tensor parallelism alone.
        world_size: processes in the run (Megatron-LM checks its parallel sizes against it).

    Returns:
        The strategy object the Accelerator dispatches to.

    Raises:
        ValueError: ``engine`` is not a known `DistributedType`, mesh dimensions FSDP1 cannot
            shard over, or Megatron-LM sizes that do not divide ``world_size``.
    """
    if isinstance(engine, EngineChoice):
        choice: EngineChoice | None = engine
        kind = engine.distributed_type
    else:
        choice, kind = None, _label(engine)
    request = _Request(kind, choice, device, ddp_kwargs, parallelism_config, world_size)
    return _BUILDERS.get(kind, _data_parallel)(request)

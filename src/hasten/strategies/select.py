"""The one place that maps the run's `DistributedType` and the user's plugins to a `Strategy`.

Called once per Accelerator; every later decision dispatches through the returned object.
"""

from __future__ import annotations

from typing import Any

import torch

from hasten.config.enums import DistributedType
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
    DistributedType.DEEPSPEED: "DeepSpeed",
    DistributedType.FSDP: "FSDP",
    DistributedType.MEGATRON_LM: "Megatron-LM",
    DistributedType.XLA: "XLA",
}


def select_strategy(
    distributed_type: Any,
    *,
    device: torch.device,
    ddp_kwargs: DDPWrapSettings | None = None,
    deepspeed_plugin: Any = None,
    fsdp_plugin: Any = None,
    megatron_lm_plugin: Any = None,
    parallelism_config: Any = None,
) -> Strategy:
    """Pick the strategy for this run.

    Args:
        distributed_type: the run's `DistributedType` (from `AcceleratorState`).
        device: this process's device; accelerators get ``device_ids=[index]`` for DDP.
        ddp_kwargs: the user's `DistributedDataParallelKwargs`, if any.
        deepspeed_plugin: a DeepSpeed plugin: selects the (not yet wired) DeepSpeed engine.
        fsdp_plugin: an FSDP plugin: selects the (not yet wired) FSDP engine.
        megatron_lm_plugin: a Megatron-LM plugin: selects the (not yet wired) Megatron engine.
        parallelism_config: a `ParallelismConfig`; sharded, tensor, context or sequence
            parallel dimensions select the (not yet wired) composable-parallelism engine.

    Returns:
        The strategy object the Accelerator dispatches to.

    Raises:
        ValueError: ``distributed_type`` is not a known `DistributedType`.
    """
    for plugin, engine in (
        (deepspeed_plugin, "DeepSpeed"),
        (fsdp_plugin, "FSDP"),
        (megatron_lm_plugin, "Megatron-LM"),
    ):
        if plugin is not None:
            return UnwiredStrategy(engine)
    beyond_ddp = list(getattr(parallelism_config, "non_dp_dim_names", []))
    if getattr(parallelism_config, "dp_shard_enabled", False):
        beyond_ddp.insert(0, "dp_shard")
    if beyond_ddp:
        return UnwiredStrategy(f"composable parallelism ({', '.join(beyond_ddp)})")
    try:
        kind = DistributedType(distributed_type)
    except ValueError:
        raise ValueError(
            f"Unknown distributed_type {distributed_type!r}; expected one of "
            f"{[t.value for t in DistributedType]}. Set it through hasten launch or "
            "`hasten config`."
        ) from None
    if kind in _UNWIRED_TYPES:
        return UnwiredStrategy(_UNWIRED_TYPES[kind])
    if kind in _DDP_TYPES:
        device_ids = None if device.type == "cpu" or device.index is None else [device.index]
        return DDPStrategy(device_ids=device_ids, ddp_kwargs=ddp_kwargs)
    return SingleDeviceStrategy()

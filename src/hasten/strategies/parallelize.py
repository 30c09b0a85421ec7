"""The order in which parallelisms are applied to a model, written once.

`parallelize` applies a `ParallelPlan` to one model, step by step, in torchtitan's order:

1. `apply_tp`: tensor parallelism, the model's plan over the ``tp`` mesh (parameter names stay);
2. `apply_ac`: activation checkpointing of the blocks the FSDP wrap policy picks (composable
   ``checkpoint``, names unchanged), picked as if no tensor-parallel plan had sharded them;
3. the precision policy's forward (autocast), then `apply_compile`: ``torch.compile`` of the whole
   model, or of its repeated blocks in place (names unchanged);
4. `apply_fsdp`: FSDP2's ``fully_shard`` on each block the wrap policy picks, bottom-up, then on the
   root, over the data-parallel mesh (1-D, or ``(dp_replicate, dp_shard)`` for HSDP).

Each step is skipped when the plan does not ask for it, so one plan describes FSDP2 alone, tensor
parallelism alone, HSDP and FSDP2 x TP. A new dimension (context or pipeline parallelism) is one
more step here, at its place in the order.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from hasten.precision import Precision
from hasten.strategies.compile import CompileSettings, compile_model
from hasten.strategies.fsdp_plugin import ignored_modules, modules_to_shard, resolve_offload
from hasten.strategies.tensor_parallel import shard_by_plan
from hasten.strategies.unwrap import is_compiled_module

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hasten.config.fsdp import FullyShardedDataParallelPlugin

__all__ = [
    "ParallelPlan",
    "apply_ac",
    "apply_compile",
    "apply_fsdp",
    "apply_tp",
    "fully_shard_kwargs",
    "parallelize",
]


@dataclasses.dataclass(frozen=True)
class ParallelPlan:
    """What `parallelize` applies to one model, and on which sub-mesh of the job's mesh.

    Attributes:
        tp_mesh: the ``tp`` mesh to shard the model's tensor-parallel plan over (None: no TP).
        fsdp: the FSDP plugin: its wrap policy, activation checkpointing and sharding options
            (None: no activation checkpointing and no FSDP).
        fsdp_mesh: the mesh ``fully_shard`` shards over (None: no FSDP).
        precision: the precision policy whose forward wraps the model before compilation.
        dynamo: the compile settings (`TorchDynamoPlugin`; None: not compiled).
    """

    tp_mesh: DeviceMesh | None = None
    fsdp: FullyShardedDataParallelPlugin | None = None
    fsdp_mesh: DeviceMesh | None = None
    precision: Precision = dataclasses.field(default_factory=Precision)
    dynamo: CompileSettings | None = None


def parallelize(model: nn.Module, plan: ParallelPlan) -> nn.Module:
    """Apply ``plan`` to ``model`` in the order written here: TP, AC, precision + compile, FSDP.

    Returns:
        The model to train with: ``model`` itself, or the compiled wrapper around it (FSDP then
        shards the module inside the wrapper; compilation is lazy, so it traces the sharded one).
    """
    if plan.tp_mesh is not None:
        model = apply_tp(model, plan.tp_mesh)
    if plan.fsdp is not None and plan.fsdp.activation_checkpointing:
        model = apply_ac(model, plan.fsdp)
    plan.precision.wrap_forward(model)
    prepared = apply_compile(model, plan.dynamo)
    if plan.fsdp is not None and plan.fsdp_mesh is not None:
        inner = cast(nn.Module, prepared._orig_mod) if is_compiled_module(prepared) else prepared
        apply_fsdp(inner, plan.fsdp, plan.fsdp_mesh)
    return prepared


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard ``model`` over ``tp_mesh`` from its tensor-parallel plan (see `shard_by_plan`)."""
    return shard_by_plan(model, tp_mesh)


def apply_ac(model: nn.Module, plugin: FullyShardedDataParallelPlugin) -> nn.Module:
    """Recompute the activations of each block the wrap policy picks (names unchanged).

    Raises:
        ValueError: the wrap policy picks no block to checkpoint.
    """
    from torch.distributed._composable import checkpoint

    blocks = modules_to_shard(plugin, model, [], count_dtensors=True)
    if not blocks:
        raise ValueError(
            "activation_checkpointing=True needs blocks to checkpoint, but the wrap policy picks "
            "none. Set auto_wrap_policy='transformer_based_wrap' with "
            "transformer_cls_names_to_wrap=[<your layer class>] (or a model with "
            "_no_split_modules)."
        )
    for block in blocks:
        checkpoint(block)
    return model


def apply_compile(model: nn.Module, dynamo: CompileSettings | None) -> nn.Module:
    """Compile ``model`` as ``dynamo`` asks: a wrapper when whole, in place by regions (see
    `compile_model`); unchanged without a backend."""
    return compile_model(model, dynamo)


def fully_shard_kwargs(plugin: FullyShardedDataParallelPlugin, mesh: DeviceMesh) -> dict[str, Any]:
    """The ``fully_shard`` options the plugin asks for, over ``mesh``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {
        "mesh": mesh,
        "reshard_after_forward": plugin.reshard_after_forward,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        "offload_policy": resolve_offload(plugin),
    }


def apply_fsdp(
    model: nn.Module, plugin: FullyShardedDataParallelPlugin, mesh: DeviceMesh
) -> nn.Module:
    """``fully_shard`` each block the wrap policy picks (deepest first), then the root."""
    from torch.distributed.fsdp import fully_shard

    kwargs = fully_shard_kwargs(plugin, mesh)
    skip = ignored_modules(plugin, model)
    ignored = {p for m in skip for p in m.parameters()}
    if ignored:
        kwargs["ignored_params"] = ignored
    for block in modules_to_shard(plugin, model, skip):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model

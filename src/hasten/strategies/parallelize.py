"""The order in which parallelisms are applied to a model, written once.

`parallelize` applies a `ParallelPlan` to one model, step by step, in torchtitan's order:

1. `apply_placement`: the model moves to its device, or to meta when FSDP2 will broadcast rank
   0's weights into empty shards (``cpu_ram_efficient_loading``; rank 0 keeps its weights);
2. `apply_tp`: tensor parallelism, the model's plan over the ``tp`` mesh (parameter names stay);
3. `apply_ac`: activation checkpointing of the blocks a wrap policy picks (composable
   ``checkpoint``, names unchanged), picked as if no tensor-parallel plan had sharded them;
4. the precision policy's forward (autocast);
5. `apply_ddp`: ``DistributedDataParallel`` around the model (a replica per process);
6. `apply_compile`: ``torch.compile`` of the whole model, or of its repeated blocks in place
   (names unchanged);
7. `apply_fsdp`: FSDP2's ``fully_shard`` on each block the wrap policy picks, bottom-up, then on
   the root, over the data-parallel mesh (1-D, or ``(dp_replicate, dp_shard)`` for HSDP); then
   rank 0's weights are broadcast into the shards when the plan asks for it.

Each step is skipped when the plan does not ask for it, so one plan describes a single process,
DDP, FSDP2 alone, tensor parallelism alone (with or without activation checkpointing), HSDP and
FSDP2 x TP. The steps take plain values (`strategies.settings`), never a user's plugin. A new
dimension (context or pipeline parallelism) is one more step here, at its place in the order.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from hasten.precision import Precision
from hasten.strategies.compile import CompileSettings, compile_model
from hasten.strategies.settings import DDPSettings, FSDPSettings, WrapSettings
from hasten.strategies.unwrap import is_compiled_module

# The FSDP and tensor-parallel steps import their modules when a plan asks for them: a plain
# (single-process or DDP) run never loads them.

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "ParallelPlan",
    "apply_ac",
    "apply_compile",
    "apply_ddp",
    "apply_fsdp",
    "apply_placement",
    "apply_tp",
    "broadcast_from_rank0",
    "fully_shard_kwargs",
    "parallelize",
]


@dataclasses.dataclass(frozen=True)
class ParallelPlan:
    """What `parallelize` applies to one model, and on which sub-mesh of the job's mesh.

    Attributes:
        device: where the model goes (None: it stays where it is).
        tp_mesh: the ``tp`` mesh to shard the model's tensor-parallel plan over (None: no TP).
        checkpoint: the blocks whose activations are recomputed (None: no activation
            checkpointing); independent of FSDP, so tensor parallelism alone can use it.
        precision: the precision policy whose forward wraps the model before compilation.
        ddp: the `DistributedDataParallel` settings (None: no DDP wrapper).
        dynamo: the compile settings (`TorchDynamoPlugin`; None: not compiled).
        fsdp: FSDP2's settings (None: no ``fully_shard``).
        fsdp_mesh: the mesh ``fully_shard`` shards over (needed with ``fsdp``).
    """

    device: torch.device | None = None
    tp_mesh: DeviceMesh | None = None
    checkpoint: WrapSettings | None = None
    precision: Precision = dataclasses.field(default_factory=Precision)
    ddp: DDPSettings | None = None
    dynamo: CompileSettings | None = None
    fsdp: FSDPSettings | None = None
    fsdp_mesh: DeviceMesh | None = None

    def __post_init__(self) -> None:
        if (self.fsdp is None) != (self.fsdp_mesh is None):
            raise ValueError(
                "ParallelPlan needs fsdp and fsdp_mesh together (FSDP2 shards over that mesh); "
                f"got fsdp={self.fsdp is not None}, fsdp_mesh={self.fsdp_mesh is not None}. "
                "Give both, or neither."
            )
        if self.ddp is not None and (self.fsdp is not None or self.tp_mesh is not None):
            raise ValueError(
                "ParallelPlan(ddp=...) replicates the whole model and cannot be combined with "
                "fsdp or tp_mesh (which split its parameters). Give ddp alone."
            )


def parallelize(model: nn.Module, plan: ParallelPlan) -> nn.Module:
    """Apply ``plan`` to ``model`` in the order written here: placement, TP, AC, precision,
    DDP, compile, FSDP (+ rank 0's weights).

    Returns:
        The model to train with: ``model`` itself, a DDP wrapper, or the compiled wrapper
        around it (FSDP then shards the module inside the wrapper; compilation is lazy, so it
        traces the sharded one).
    """
    from_rank0 = plan.fsdp is not None and plan.fsdp.from_rank0
    weights = apply_placement(model, plan.device, to_meta=from_rank0)
    if plan.tp_mesh is not None:
        model = apply_tp(model, plan.tp_mesh)
    if plan.checkpoint is not None:
        model = apply_ac(model, plan.checkpoint)
    plan.precision.wrap_forward(model)
    if plan.ddp is not None:
        model = apply_ddp(model, plan.ddp)
    prepared = apply_compile(model, plan.dynamo)
    if plan.fsdp is not None and plan.fsdp_mesh is not None:
        inner = cast(nn.Module, prepared._orig_mod) if is_compiled_module(prepared) else prepared
        apply_fsdp(inner, plan.fsdp, plan.fsdp_mesh)
        if weights is not None:
            broadcast_from_rank0(inner, weights, plan.device or plan.fsdp_mesh.device_type)
    return prepared


@dataclasses.dataclass(frozen=True)
class _Weights:
    """Rank 0's weights (views) and the non-persistent buffers, kept while the model is meta."""

    state: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


def apply_placement(
    model: nn.Module, device: torch.device | None, *, to_meta: bool = False
) -> _Weights | None:
    """Move ``model`` to ``device`` (None: leave it); with ``to_meta``, keep rank 0's weights and
    the non-persistent buffers aside and move the model to meta instead.

    Returns:
        What `broadcast_from_rank0` needs after sharding (None without ``to_meta``).
    """
    if not to_meta:
        if device is not None:
            model.to(device)
        return None
    # Views of the weights: moving the module to meta keeps only this one copy alive. Other
    # ranks may hold a meta model: nothing to keep.
    state = {k: v.detach() for k, v in model.state_dict().items()} if dist.get_rank() == 0 else {}
    weights = _Weights(state, _non_persistent_buffers(model))
    model.to("meta")
    return weights


def _non_persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    found = {}
    for prefix, module in model.named_modules():
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            buffer = module._buffers.get(name)
            if buffer is not None:
                found[f"{prefix}.{name}" if prefix else name] = buffer
    return found


def broadcast_from_rank0(model: nn.Module, weights: _Weights, device: torch.device | str) -> None:
    """Fill the meta shards of ``model`` with rank 0's weights, and its non-persistent buffers
    with rank 0's copy (they are in no state dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=True)
    set_model_state_dict(model, dict(weights.state), options=options)
    for name, value in weights.buffers.items():
        tensor = torch.empty_like(value, device=device) if value.is_meta else value.to(device)
        dist.broadcast(tensor, src=0)
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = tensor


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard ``model`` over ``tp_mesh`` from its tensor-parallel plan (see `shard_by_plan`)."""
    from hasten.strategies.tensor_parallel import shard_by_plan

    return shard_by_plan(model, tp_mesh)


def apply_ac(model: nn.Module, blocks: WrapSettings) -> nn.Module:
    """Recompute the activations of each block ``blocks`` picks (names unchanged).

    Raises:
        ValueError: the wrap policy picks no block to checkpoint.
    """
    from torch.distributed._composable import checkpoint

    from hasten.strategies.fsdp_plugin import modules_to_shard

    chosen = modules_to_shard(blocks, model, [], count_dtensors=True)
    if not chosen:
        raise ValueError(
            "activation_checkpointing=True needs blocks to checkpoint, but the wrap policy picks "
            "none. Set auto_wrap_policy='transformer_based_wrap' with "
            "transformer_cls_names_to_wrap=[<your layer class>] (or a model with "
            "_no_split_modules)."
        )
    for block in chosen:
        checkpoint(block)
    return model


def apply_ddp(model: nn.Module, settings: DDPSettings) -> nn.Module:
    """Wrap ``model`` in `DistributedDataParallel` and install the comm hook; a model without
    trainable parameters stays as it is (DDP refuses it: e.g. a frozen evaluation model)."""
    from torch.nn.parallel import DistributedDataParallel

    if not any(p.requires_grad for p in model.parameters()):
        return model
    wrapped = DistributedDataParallel(model, **dict(settings.kwargs))
    if settings.comm_hook is not None:
        settings.comm_hook(wrapped)
    return wrapped


def apply_compile(model: nn.Module, dynamo: CompileSettings | None) -> nn.Module:
    """Compile ``model`` as ``dynamo`` asks: a wrapper when whole, in place by regions (see
    `compile_model`); unchanged without a backend."""
    return compile_model(model, dynamo)


def fully_shard_kwargs(settings: FSDPSettings, mesh: DeviceMesh) -> dict[str, Any]:
    """The ``fully_shard`` options ``settings`` ask for, over ``mesh``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

    return {
        "mesh": mesh,
        "reshard_after_forward": settings.reshard_after_forward,
        "mp_policy": settings.mixed_precision or MixedPrecisionPolicy(),
        "offload_policy": settings.offload if settings.offload is not None else OffloadPolicy(),
    }


def apply_fsdp(model: nn.Module, settings: FSDPSettings, mesh: DeviceMesh) -> nn.Module:
    """``fully_shard`` each block the wrap policy picks (deepest first), then the root."""
    from torch.distributed.fsdp import fully_shard

    from hasten.strategies.fsdp_plugin import ignored_modules, modules_to_shard

    kwargs = fully_shard_kwargs(settings, mesh)
    skip = ignored_modules(settings.ignored, model)
    ignored = {p for m in skip for p in m.parameters()}
    if ignored:
        kwargs["ignored_params"] = ignored
    for block in modules_to_shard(settings.wrap, model, skip):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model

"""What an FSDP plugin asks for, read against one model: the blocks its wrap policy picks, the
modules it leaves alone, and the offload policy that can run here.

Shared by FSDP2's steps in `strategies.parallelize` (activation checkpointing, ``fully_shard``),
FSDP1 (ignored modules) and Accelerate's ``fsdp_utils`` helpers.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

__all__ = ["ignored_modules", "modules_to_shard", "resolve_offload"]


def _no_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return accelerator is None or not accelerator.is_available()


def resolve_offload(plugin: FullyShardedDataParallelPlugin) -> Any:
    """The offload policy to use; a pinned-memory one on a machine without an accelerator raises.

    A ``cpu_offload=True`` request (a bool, turned into ``CPUOffloadPolicy()`` by the plugin)
    gets ``pin_memory=False`` there: pinning needs an accelerator.

    Raises:
        ValueError: an explicit ``CPUOffloadPolicy(pin_memory=True)`` without an accelerator.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy

    policy = plugin.cpu_offload
    if not isinstance(policy, CPUOffloadPolicy) or not policy.pin_memory or not _no_accelerator():
        return policy
    if getattr(plugin, "_cpu_offload_from_bool", False):
        return CPUOffloadPolicy(pin_memory=False)
    raise ValueError(
        "cpu_offload=CPUOffloadPolicy(pin_memory=True) needs an accelerator to pin host memory, "
        "and this machine has none (torch would fail with 'Cannot access accelerator device'). "
        "Pass cpu_offload=CPUOffloadPolicy(pin_memory=False), or cpu_offload=True (hasten then "
        "disables pinning here)."
    )


def ignored_modules(plugin: Any, model: nn.Module) -> list[nn.Module]:
    """The modules FSDP leaves alone: the plugin's modules, or those whose name matches its regex.

    ``plugin`` is anything with an ``ignored_modules`` attribute (the FSDP plugin, or
    Accelerate's helper holding a bare list).

    Raises:
        ValueError: the regex matches no module (naming a few module names).
    """
    spec = plugin.ignored_modules
    if spec is None or spec == "":
        return []
    if not isinstance(spec, str):
        return list(spec)
    pattern = re.compile(spec)
    found = [m for name, m in model.named_modules() if name and pattern.fullmatch(name)]
    if not found:
        names = [name for name, _ in model.named_modules() if name][:8]
        raise ValueError(
            f"ignored_modules={spec!r} matches no module name of this model (a full match is "
            f"needed); some names: {names}. Fix the pattern or leave ignored_modules unset."
        )
    return found


def _policy_for(
    plugin: FullyShardedDataParallelPlugin, model: nn.Module, count_dtensors: bool
) -> Callable[[nn.Module], bool] | None:
    bound = copy.copy(plugin)  # set_auto_wrap_policy binds classes of this model only
    bound.set_auto_wrap_policy(model)
    policy = cast(Callable[..., bool] | None, bound.auto_wrap_policy)  # bound: a callable
    if policy is None:
        return None
    dtensor = _dtensor()

    def picks(module: nn.Module) -> bool:
        numel = sum(
            p.numel() for p in module.parameters() if count_dtensors or not isinstance(p, dtensor)
        )
        return bool(policy(module=module, recurse=False, nonwrapped_numel=numel))

    return picks


def _dtensor() -> type:
    from torch.distributed.tensor import DTensor

    return DTensor


def modules_to_shard(
    plugin: FullyShardedDataParallelPlugin,
    model: nn.Module,
    skip: list[nn.Module],
    *,
    count_dtensors: bool = False,
) -> list[nn.Module]:
    """Submodules the wrap policy picks, deepest first (the root is sharded last, separately).

    A size-based policy counts the parameters not sharded yet (``fully_shard`` turns the
    blocks below into DTensors, as FSDP1 counts its unwrapped parameters); ``count_dtensors``
    counts every parameter at its full size (blocks to checkpoint are picked as if no
    tensor-parallel plan had sharded them).
    """
    picks = _policy_for(plugin, model, count_dtensors)
    if picks is None:
        return []
    skipped = {id(m) for m in skip}
    chosen = []
    for module in reversed(list(model.modules())):
        if module is model or id(module) in skipped:
            continue
        if picks(module):
            chosen.append(module)
    return chosen

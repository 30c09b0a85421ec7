"""What an FSDP plugin asks for: read once into `FSDPSettings` / `WrapSettings`, then against one
model: the blocks a wrap policy picks, the modules FSDP leaves alone, and the offload policy that
can run here.

Shared by FSDP2's steps in `strategies.parallelize` (activation checkpointing, ``fully_shard``),
FSDP1 (ignored modules) and Accelerate's ``fsdp_utils`` helpers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from hasten.strategies.settings import FSDPSettings, WrapSettings

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

    from hasten.config.fsdp import FullyShardedDataParallelPlugin

__all__ = [
    "fsdp_settings",
    "ignored_modules",
    "modules_to_shard",
    "resolve_offload",
    "wrap_settings",
]


def _no_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return accelerator is None or not accelerator.is_available()


def wrap_settings(plugin: FullyShardedDataParallelPlugin) -> WrapSettings:
    """The plugin's wrap policy as a `WrapSettings` (bound to each model later, the plugin
    untouched)."""
    names = plugin.transformer_cls_names_to_wrap
    return WrapSettings(
        policy=cast("Callable[..., bool] | None", plugin.auto_wrap_policy),  # names resolved
        class_names=tuple(names) if names is not None else None,
        min_num_params=int(plugin.min_num_params or 0),
    )


def fsdp_settings(plugin: FullyShardedDataParallelPlugin) -> FSDPSettings:
    """What FSDP2's steps need of the plugin, resolved once (see `resolve_offload`).

    Raises:
        ValueError: a pinned-memory offload on a machine without an accelerator.
    """
    spec = plugin.ignored_modules
    ignored = spec if isinstance(spec, str) or spec is None else tuple(spec)
    return FSDPSettings(
        wrap=wrap_settings(plugin),
        reshard_after_forward=cast("bool | int", plugin.reshard_after_forward),  # validated
        mixed_precision=cast("MixedPrecisionPolicy | None", plugin.mixed_precision_policy),
        offload=resolve_offload(plugin),
        ignored=ignored if ignored != "" else None,
        from_rank0=bool(plugin.cpu_ram_efficient_loading),
    )


def resolve_offload(plugin: FullyShardedDataParallelPlugin) -> OffloadPolicy | None:
    """The offload policy to use; a pinned-memory one on a machine without an accelerator raises.

    A ``cpu_offload=True`` request (a bool, turned into ``CPUOffloadPolicy()`` by the plugin)
    gets ``pin_memory=False`` there: pinning needs an accelerator.

    Raises:
        ValueError: an explicit ``CPUOffloadPolicy(pin_memory=True)`` without an accelerator.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy

    policy = cast("OffloadPolicy | None", plugin.cpu_offload)  # FSDP2: resolved to a policy
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


def ignored_modules(spec: Iterable[nn.Module] | str | None, model: nn.Module) -> list[nn.Module]:
    """The modules FSDP leaves alone: ``spec``'s modules, or those whose name matches its regex
    (a plugin's ``ignored_modules``, or Accelerate's helper's bare list).

    Raises:
        ValueError: the regex matches no module (naming a few module names).
    """
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
    wrap: WrapSettings, model: nn.Module, count_dtensors: bool
) -> Callable[[nn.Module], bool] | None:
    policy = wrap.bind(model)
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
    wrap: WrapSettings,
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
    picks = _policy_for(wrap, model, count_dtensors)
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

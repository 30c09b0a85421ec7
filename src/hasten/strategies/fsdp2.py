"""FSDP2: every parameter becomes a `DTensor` sharded over the processes by ``fully_shard``.

Preparing a model follows the engine's order: activation checkpointing (composable
``checkpoint``, parameter names unchanged), then compilation (regional compilation compiles
blocks in place), then ``fully_shard`` on each module the wrap policy picks, bottom-up, and on the
root. With ``cpu_ram_efficient_loading`` rank 0 keeps the real weights while every process
shards an empty (meta) copy, and the weights are broadcast from rank 0 into the shards: the
other ranks may pass a model built on meta (``init_empty_weights``) and then never hold more
than their shard and one broadcast tensor.
Optimizers built on the user's model are rebound to the DTensor parameters by name afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import override

from hasten.precision import Precision
from hasten.strategies.sharded import ShardedStrategy, state_dict_options, tied_parameter_names
from hasten.strategies.unwrap import is_compiled_module

__all__ = [
    "FSDP2Strategy",
    "apply_activation_checkpointing",
    "ignored_modules",
    "modules_to_shard",
    "resolve_offload",
]


def _no_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return accelerator is None or not accelerator.is_available()


def resolve_offload(plugin: Any) -> Any:
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


def _policy_for(plugin: Any, model: nn.Module) -> Callable[[nn.Module], bool] | None:
    bound = copy.copy(plugin)  # set_auto_wrap_policy binds classes of this model only
    bound.set_auto_wrap_policy(model)
    policy = bound.auto_wrap_policy
    if policy is None:
        return None

    def picks(module: nn.Module) -> bool:
        numel = sum(p.numel() for p in module.parameters() if not isinstance(p, _dtensor()))
        return bool(policy(module=module, recurse=False, nonwrapped_numel=numel))

    return picks


def _dtensor() -> type:
    from torch.distributed.tensor import DTensor

    return DTensor


def modules_to_shard(plugin: Any, model: nn.Module, skip: list[nn.Module]) -> list[nn.Module]:
    """Submodules the wrap policy picks, deepest first (the root is sharded last, separately)."""
    picks = _policy_for(plugin, model)
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


def apply_activation_checkpointing(plugin: Any, model: nn.Module) -> nn.Module:
    """Recompute the activations of each block the wrap policy picks (names unchanged).

    Raises:
        ValueError: the wrap policy picks no block to checkpoint.
    """
    from torch.distributed._composable import checkpoint

    blocks = modules_to_shard(plugin, model, [])
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


def _non_persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    found = {}
    for prefix, module in model.named_modules():
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            buffer = module._buffers.get(name)
            if buffer is not None:
                found[f"{prefix}.{name}" if prefix else name] = buffer
    return found


def _refuse_meta(module: nn.Module) -> None:
    meta = [name for name, p in module.named_parameters() if p.is_meta]
    if meta:
        raise ValueError(
            f"The model has {len(meta)} parameter(s) on the meta device (first: {meta[0]}), and "
            "FSDP without cpu_ram_efficient_loading needs real weights on every process. Set "
            "cpu_ram_efficient_loading=True (FSDP_CPU_RAM_EFFICIENT_LOADING=true) to broadcast "
            "the main process's weights, or build the real model on every process."
        )


class FSDP2Strategy(ShardedStrategy):
    """Shard with ``torch.distributed.fsdp.fully_shard`` as the plugin asks."""

    name = "fsdp2"

    @override
    def check_usable(self) -> None:
        resolve_offload(self.plugin)
        if self.plugin.activation_checkpointing_offload and self.device.type != "cpu":
            raise ValueError(
                "activation_checkpointing_offload is not wired in hasten's FSDP2 strategy yet; "
                "set activation_checkpointing_offload=False (activation_checkpointing=True still "
                "recomputes activations)."
            )

    def _shard_kwargs(self) -> dict[str, Any]:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return {
            "reshard_after_forward": self.plugin.reshard_after_forward,
            "mp_policy": self.plugin.mixed_precision_policy or MixedPrecisionPolicy(),
            "offload_policy": resolve_offload(self.plugin),
        }

    @override
    def prepare_module(
        self,
        module: nn.Module,
        device: torch.device | None,
        *,
        precision: Precision,
        compile_fn: Callable[[nn.Module], nn.Module],
    ) -> nn.Module:
        self.check_usable()
        ties = tied_parameter_names(module)
        efficient = bool(self.plugin.cpu_ram_efficient_loading)
        if not efficient:
            _refuse_meta(module)
        full_state = self._take_weights(module) if efficient else None
        buffers = _non_persistent_buffers(module) if efficient else {}
        if efficient:
            module.to("meta")
        elif device is not None:
            module.to(device)
        if self.plugin.activation_checkpointing:
            apply_activation_checkpointing(self.plugin, module)
        precision.wrap_forward(module)
        prepared = compile_fn(module)
        inner = cast(nn.Module, prepared._orig_mod) if is_compiled_module(prepared) else prepared
        self.shard(inner)
        if full_state is not None:
            self._broadcast_weights(inner, full_state, buffers, device or self.device)
        self._record_ties(prepared, ties)
        return prepared

    def shard(self, module: nn.Module) -> nn.Module:
        """``fully_shard`` each block the policy picks, then the root."""
        from torch.distributed.fsdp import fully_shard

        kwargs = self._shard_kwargs()
        skip = ignored_modules(self.plugin, module)
        ignored = {p for m in skip for p in m.parameters()}
        if ignored:
            kwargs["ignored_params"] = ignored
        for block in modules_to_shard(self.plugin, module, skip):
            fully_shard(block, **kwargs)
        fully_shard(module, **kwargs)
        return module

    @staticmethod
    def _take_weights(module: nn.Module) -> dict[str, torch.Tensor]:
        """Rank 0's real weights (other ranks may hold a meta model: nothing to keep)."""
        if dist.get_rank() != 0:
            return {}
        # Views of the weights: moving the module to meta keeps only this one copy alive.
        return {k: v.detach() for k, v in module.state_dict().items()}

    def _broadcast_weights(
        self,
        module: nn.Module,
        full_state: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        device: torch.device,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        module.to_empty(device=device)
        options = state_dict_options(full=True, cpu_offload=False)
        set_model_state_dict(module, dict(full_state), options=options)
        for name, value in buffers.items():  # not in state dicts: rank 0's copy wins
            tensor = torch.empty_like(value, device=device) if value.is_meta else value.to(device)
            dist.broadcast(tensor, src=0)
            owner, _, leaf = name.rpartition(".")
            module.get_submodule(owner)._buffers[leaf] = tensor

    @override
    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[None]:
        return _gradient_sync_off(self._module(module))

    @override
    def __repr__(self) -> str:
        return (
            f"FSDP2Strategy(reshard_after_forward={self.plugin.reshard_after_forward!r}, "
            f"state_dict={self.checkpoint_layout!r})"
        )


@contextlib.contextmanager
def _gradient_sync_off(module: nn.Module) -> Iterator[None]:
    setter = getattr(module, "set_requires_gradient_sync", None)
    if setter is None:
        yield
        return
    setter(False)
    try:
        yield
    finally:
        setter(True)

"""Accelerate's FSDP prepare helpers (``accelerate.utils.fsdp_utils``), over hasten's strategies.

``fsdp2_prepare_model``, ``fsdp2_apply_ac`` and the other ``fsdp2_*`` helpers expose pieces of
the composable strategy's prepare (`hasten.strategies.parallelize` applies them, in its
written order); `fsdp_strategy` is the FSDP strategy of a run, for these helpers and for the
checkpoint helpers of `hasten.checkpointing.fsdp_utils`. ``hasten.utils.fsdp_utils`` re-exports
every public name at its Accelerate path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn

from hasten.config import envvars
from hasten.precision import Precision
from hasten.state import PartialState
from hasten.strategies.composable import ComposableStrategy
from hasten.strategies.fsdp1 import FSDP1Strategy
from hasten.strategies.fsdp_plugin import ignored_modules, modules_to_shard, wrap_settings
from hasten.strategies.parallelize import apply_ac
from hasten.strategies.rebind import canonical_name
from hasten.strategies.sharded import ShardedStrategy, state_dict_options

if TYPE_CHECKING:
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.state import AcceleratorState
    from hasten.strategies.base import Strategy

__all__ = [
    "FSDPRunView",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "fsdp_strategy",
    "get_fsdp2_grad_scaler",
    "get_parameters_from_modules",
]


class FSDPRunView(Protocol):
    """What Accelerate's FSDP helpers read of the run they are given (the Accelerator has it)."""

    @property
    def state(self) -> AcceleratorState:
        """The shared state (its ``fsdp_plugin``)."""
        ...

    @property
    def device(self) -> torch.device:
        """This process's device."""
        ...

    @property
    def strategy(self) -> Strategy | None:
        """The run's strategy (None before one is chosen)."""
        ...


def fsdp_strategy(
    fsdp_plugin: FullyShardedDataParallelPlugin | None, accelerator: FSDPRunView
) -> ShardedStrategy:
    """The run's FSDP strategy for ``fsdp_plugin`` (None: the run's own plugin).

    The run's strategy when it holds that plugin; otherwise a strategy for the plugin alone
    (FSDP2's composable one, or FSDP1's).

    Raises:
        ValueError: neither the call nor the run has an FSDP plugin.
    """
    strategy = accelerator.strategy
    if isinstance(strategy, ShardedStrategy):
        held = strategy.plugin  # None: tensor parallelism alone, no FSDP
        if held is not None and (fsdp_plugin is None or fsdp_plugin is held):
            return strategy
    plugin = fsdp_plugin if fsdp_plugin is not None else accelerator.state.fsdp_plugin
    if plugin is None:
        raise ValueError(
            "This helper needs an FSDP run: pass the FullyShardedDataParallelPlugin (or create "
            "the Accelerator with fsdp_plugin=...)."
        )
    if plugin.fsdp_version == 2:
        return ComposableStrategy(plugin, accelerator.device)
    return FSDP1Strategy(plugin, accelerator.device)


def enable_fsdp_ram_efficient_loading() -> None:
    """Ask for rank-0-only weight loading (``FSDP_CPU_RAM_EFFICIENT_LOADING=true``).

    Also sets ``ACCELERATE_USE_FSDP=true`` when unset, as Accelerate does: transformers'
    ``from_pretrained`` builds the model on meta on the other ranks only when both are set.
    """
    if envvars.read("ACCELERATE_USE_FSDP") is None:
        envvars.write("ACCELERATE_USE_FSDP", "true")
    envvars.write("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")


def disable_fsdp_ram_efficient_loading() -> None:
    """Load weights on every rank again (``FSDP_CPU_RAM_EFFICIENT_LOADING=false``)."""
    envvars.write("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")


def fsdp2_prepare_model(accelerator: FSDPRunView, model: nn.Module) -> nn.Module:
    """Shard ``model`` with FSDP2 as the Accelerator's plugin asks (no compile, no autocast)."""
    strategy = fsdp_strategy(None, accelerator)
    if not isinstance(strategy, ComposableStrategy) or strategy.plugin is None:
        raise ValueError("fsdp2_prepare_model needs fsdp_version=2 in the FSDP plugin.")
    return strategy.shard(model, accelerator.device, precision=Precision(), dynamo=None)


def fsdp2_load_full_state_dict(
    accelerator: FSDPRunView, model: nn.Module, full_sd: dict, cpu_offload: bool = False
) -> None:
    """Load a full state dict held by rank 0 (others may pass ``{}``) into a sharded model."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    options = state_dict_options(full=True, cpu_offload=cpu_offload)
    set_model_state_dict(model, full_sd, options=options)


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Replace each optimizer parameter by ``mapping[param.data_ptr()]`` (or ``mapping[param]``).

    Raises:
        KeyError: a parameter has no entry (the optimizer would keep training a stale copy).
    """
    for group in optimizer.param_groups:
        replaced = []
        for param in group["params"]:
            new = mapping.get(param.data_ptr(), mapping.get(param))
            if new is None:
                raise KeyError(
                    f"No new parameter for an optimizer parameter of shape {tuple(param.shape)}: "
                    "build the mapping from every parameter of the model before sharding."
                )
            replaced.append(new)
        group["params"] = replaced


def fsdp2_apply_ac(accelerator: FSDPRunView, model: nn.Module) -> nn.Module:
    """Checkpoint the activations of the blocks the plugin's wrap policy picks."""
    plugin = fsdp_strategy(None, accelerator).plugin  # an FSDP strategy's: never None here
    return apply_ac(model, wrap_settings(cast("FullyShardedDataParallelPlugin", plugin)))


def fsdp2_canonicalize_names(named_params: dict) -> dict:
    """Drop wrapper pieces (``_checkpoint_wrapped_module.``, ``_orig_mod.``...) from the keys."""
    return {canonical_name(name): value for name, value in named_params.items()}


def fsdp2_prepare_auto_wrap_policy(
    fsdp2_plugin: FullyShardedDataParallelPlugin, model: nn.Module
) -> Callable[[nn.Module], bool] | None:
    """``policy(module) -> bool`` for the plugin's wrap policy bound to ``model`` (None: no wrap)."""
    chosen = {id(m) for m in modules_to_shard(wrap_settings(fsdp2_plugin), model, [])}
    if not chosen:
        return None
    return lambda module: id(module) in chosen


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """FSDP2 uses torch's plain `GradScaler` (DTensor gradients unscale in place)."""
    return torch.amp.GradScaler(PartialState().device.type, **kwargs)


def get_parameters_from_modules(
    modules: Iterable[nn.Module] | str, model: nn.Module, device: Any
) -> set[nn.Parameter]:
    """The parameters of ``modules`` (modules, or a regex of module names in ``model``)."""
    return {p for module in ignored_modules(modules, model) for p in module.parameters()}


def ensure_weights_retied(param_init_fn: Any, model: nn.Module, device: torch.device) -> Any:
    """Wrap ``param_init_fn`` so parameters tied in ``model`` stay tied after initialisation."""
    tied: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            tied.setdefault(id(param), []).append((module, name))
    groups = [owners for owners in tied.values() if len(owners) > 1]
    if not groups:
        return param_init_fn

    def init_and_retie(module: nn.Module) -> Any:
        result = param_init_fn(module)
        for owners in groups:
            first, name = owners[0]
            for other, other_name in owners[1:]:
                setattr(other, other_name, getattr(first, name))
        return result

    return init_and_retie

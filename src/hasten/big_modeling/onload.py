"""Bring offloaded weights back for a moment: to read, save or edit a dispatched model.

A module whose `AlignDevicesHook` offloads keeps its weights on the meta device between
forwards; these helpers load them (as a forward would), hand them out, and drop them again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import cast

import torch
from torch import nn

from hasten.big_modeling.hooks import AlignDevicesHook
from hasten.big_modeling.tensors import set_module_tensor_to_device

__all__ = [
    "align_module_device",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
]

logger = logging.getLogger(__name__)

_META = torch.device("meta")


def has_offloaded_params(module: nn.Module) -> bool:
    """Return whether `module`'s weights are offloaded by its `AlignDevicesHook` (meta between uses)."""
    hook = getattr(module, "_hf_hook", None)
    return isinstance(hook, AlignDevicesHook) and bool(hook.offload)


@contextlib.contextmanager
def align_module_device(
    module: nn.Module, execution_device: torch.device | None = None
) -> Iterator[None]:
    """Within the block, `module`'s own parameters are real tensors on `execution_device`.

    Offloaded modules load their weights (on `execution_device`, default the hook's execution
    device) and drop them on exit; other modules have their direct parameters moved to
    `execution_device` and back. Without offload and device, nothing moves.
    """
    hook = getattr(module, "_hf_hook", None)
    if has_offloaded_params(module):
        with cast(AlignDevicesHook, hook).weights_loaded(module, execution_device):
            yield
        return
    if execution_device is None:
        yield
        return
    originals = dict(module.named_parameters(recurse=False))
    try:
        for name in originals:
            set_module_tensor_to_device(module, name, execution_device)
        yield
    finally:
        for name, original in originals.items():
            # Current values go back (edits made in the block are kept); a parameter that was
            # parked on the meta device has no data to move, so its original returns.
            current = getattr(module, name)
            value = original if current.device == _META else None
            set_module_tensor_to_device(module, name, original.device, value=value)


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, str | torch.Tensor],
    device_to_put_offload: int | str | torch.device = "cpu",
) -> dict[str, str | torch.Tensor]:
    """Fill `state_dict`'s entries of `module` (named `module_name`, a tensor name) with real values.

    `module_name` is the full name of one of the module's tensors (``"layer.0.weight"``); every
    key of `state_dict` under the same module prefix gets the module's current tensor. Offloaded
    weights are loaded onto `device_to_put_offload` to do so.
    """
    prefix = module_name.rpartition(".")[0]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):  # type: ignore[arg-type]
        for key, value in module.state_dict().items():
            full = f"{prefix}.{key}" if prefix else key
            if full in state_dict:
                state_dict[full] = value
    return state_dict


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return the full state dict of a model with offloaded modules, on the CPU, one module at a time.

    Tensors still on the meta device after loading (placeholders no hook knows) are left out,
    with a warning naming them.

    Raises:
        MemoryError: a module's weights do not fit in CPU memory.
    """
    state_dict: dict[str, torch.Tensor] = {}
    placeholders: set[str] = set()
    for name, module in model.named_modules():
        if name == "":
            continue
        try:
            with align_module_device(module, "cpu"):  # type: ignore[arg-type]
                module_state = module.state_dict()
        except MemoryError:
            raise MemoryError(
                f"Module {name!r} does not fit in CPU memory once loaded; an offloaded model must "
                "fit module by module to save it. Free memory or save with a smaller model."
            ) from None
        for key, value in module_state.items():
            full = f"{name}.{key}"
            if value.device == _META:
                placeholders.add(full)
            else:
                state_dict[full] = value.to("cpu")
    missing = sorted(placeholders - set(state_dict))
    if missing:
        logger.warning("These tensors were not saved, still on the meta device: %s", missing)
    return state_dict

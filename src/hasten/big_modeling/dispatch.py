"""Run a model spread over devices: dispatch with hooks, cpu/disk offload, load-and-dispatch."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hasten.big_modeling.device_map import device_for, resolve_device_map
from hasten.big_modeling.hooks import AlignDevicesHook, CpuOffload, UserCpuOffloadHook
from hasten.big_modeling.loading import checkpoint_files
from hasten.big_modeling.offload import OffloadedWeightsLoader
from hasten.big_modeling.tensors import as_device, first_device

__all__ = [
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "load_checkpoint_and_dispatch",
]

logger = logging.getLogger(__name__)
_META = torch.device("meta")
_OFFLOAD_TARGETS = ("cpu", "disk")


def _late() -> Any:
    """``hasten.big_modeling``, through which the helpers below are called.

    They are looked up there at each call, as Accelerate's ``big_modeling`` module globals are:
    downstream code replaces them on that module (transformers swaps
    ``accelerate.big_modeling.check_device_map`` for a no-op while it dispatches).
    """
    return sys.modules["hasten.big_modeling"]


def cpu_offload(
    model: nn.Module,
    execution_device: torch.device | None = None,
    offload_buffers: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep one cpu copy of the weights; each submodule loads its own onto
    ``execution_device`` just before it runs and drops them right after.

    Args:
        execution_device: where the forward runs (default: where the model's weights are).
        offload_buffers: offload buffers too.
        state_dict: the cpu weights to use (default: the model's, moved to cpu).
        preload_module_classes: classes whose whole subtree loads at once.
    """
    if execution_device is None:
        execution_device = first_device(model)
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    _late().add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    _late().attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=state_dict,
        preload_module_classes=preload_module_classes,
    )
    return model


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on cpu until it runs, then leave it on the device until ``hook.offload()``.

    Chain models of a pipeline with ``prev_module_hook``: running a model sends the previous
    one back to cpu.

    Returns:
        The model and its `UserCpuOffloadHook`.
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    _late().add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Write the weights to ``offload_dir`` (unless an index is already there) and read each
    submodule's weights memory-mapped just before it runs."""
    if not (Path(offload_dir) / "index.json").is_file():
        _late().offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = first_device(model)
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    _late().add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    _late().attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=weights_map,
        preload_module_classes=preload_module_classes,
    )
    return model


def _check_loaded(
    model: nn.Module, device_map: dict[str, Any], available: Any, offloaded: tuple[str, ...]
) -> None:
    """Refuse to run with weights that were never loaded (still on meta, not offloaded)."""
    tensors = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers())
    if not any(tensor.device == _META for _, tensor in tensors):
        return
    groups = {name: group for group in _late().find_tied_parameters(model) for name in group}
    present: set[str] = set()
    missing: list[str] = []
    for name, tensor in tensors:
        device = device_for(name, device_map)
        if tensor.device != _META or (
            device in offloaded and available is not None and name in available
        ):
            present.add(name)
    for name, _ in tensors:
        if name not in present and not present.intersection(groups.get(name, ())):
            missing.append(name)
    if missing:
        raise ValueError(
            f"These weights were never loaded (still on the meta device): {', '.join(missing)}. "
            "The checkpoint has no value for them; load a matching checkpoint first."
        )


def _guard_moves(model: nn.Module) -> None:
    """After a multi-device dispatch, moving the whole model would undo it: warn, or refuse."""

    def guard(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if any(p.device == _META for p in model.parameters()):
                raise RuntimeError(
                    f"{type(model).__name__} has weights offloaded to cpu or disk by "
                    "dispatch_model; it cannot be moved as a whole. Remove its hooks first "
                    "(hasten.hooks.remove_hook_from_submodules) or dispatch it again."
                )
            logger.warning("moving a model dispatched over several devices undoes the dispatch")
            return method(*args, **kwargs)

        return wrapper

    for name in ("to", "cuda", "xpu", "npu", "mlu", "musa"):
        method = getattr(model, name, None)
        if method is not None:
            setattr(model, name, guard(method))


def dispatch_model(
    model: nn.Module,
    device_map: dict[str, str | int | torch.device],
    main_device: torch.device | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: dict[str, str] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Place a (loaded) model as ``device_map`` says and hook it so it runs across devices.

    Blocks on accelerators stay there; blocks mapped to cpu (when an accelerator runs) or disk
    are loaded onto the main device only while they run. Inputs follow each block; outputs
    come back where the inputs were.

    Args:
        device_map: name -> device (or ``"auto"`` / ``"balanced"`` / ``"sequential"`` ...).
        main_device: the device offloaded blocks run on (default: the first accelerator in
            the map, else cpu).
        state_dict: cpu weights of the cpu-mapped blocks (default: taken from the model).
        offload_dir: folder of disk-offloaded weights (written from the model if no index).
        offload_index: index of the offloaded weights (default: ``offload_dir/index.json``).
        offload_buffers: offload buffers with the weights.
        skip_keys: keys of dict inputs/outputs left where they are.
        preload_module_classes: classes whose whole subtree loads at once.
        force_hooks: hook the model even when it sits on one device.

    Raises:
        ValueError: bad map, disk blocks without ``offload_dir``, weights never loaded.
    """
    device_map = resolve_device_map(model, device_map)  # type: ignore[assignment]
    _late().check_device_map(model, device_map)
    devices = list(dict.fromkeys(device_map.values()))
    if len(devices) == 1 and devices[0] != "disk" and not force_hooks:
        _check_loaded(model, device_map, None, ())
        model.to(as_device(devices[0]))
        model.__dict__["hf_device_map"] = dict(device_map)
        return model
    if main_device is None:
        on_device = [d for d in devices if d not in _OFFLOAD_TARGETS]
        main_device = on_device[0] if on_device else "cpu"  # type: ignore[assignment]
    main_is_host = str(main_device) in ("cpu", "mps")
    offloaded = ("disk",) if main_is_host else _OFFLOAD_TARGETS
    cpu_blocks = [n for n, d in device_map.items() if d == "cpu"] if not main_is_host else []
    if state_dict is None and cpu_blocks:
        state_dict = _late().extract_submodules_state_dict(model.state_dict(), cpu_blocks)
    disk_blocks = [n for n, d in device_map.items() if d == "disk"]
    if disk_blocks and offload_dir is None and offload_index is None:
        raise ValueError(
            f"device_map sends {disk_blocks!r} to disk but no offload_dir was given: pass "
            "offload_dir='some/folder' (where the weights are, or will be, offloaded)."
        )
    if (
        disk_blocks
        and offload_dir is not None
        and offload_index is None
        and not (Path(offload_dir) / "index.json").is_file()
    ):
        disk_state = _late().extract_submodules_state_dict(model.state_dict(), disk_blocks)
        _late().offload_state_dict(offload_dir, disk_state)
    weights_map = None
    if state_dict or disk_blocks:
        weights_map = OffloadedWeightsLoader(
            state_dict=state_dict, save_folder=offload_dir, index=offload_index
        )
    _check_loaded(model, device_map, weights_map, offloaded)
    execution = {n: main_device if d in _OFFLOAD_TARGETS else d for n, d in device_map.items()}
    offload = {n: d in offloaded for n, d in device_map.items()}
    tied = _late().find_tied_parameters(model)
    tied_map: dict[int, dict[torch.device, torch.Tensor]] = {}
    for group in tied:
        for name in group:
            tensor = model.get_parameter(name)
            if tensor.device != _META:
                tied_map[tensor.data_ptr()] = {}
    _late().attach_align_device_hook_on_blocks(
        model,
        execution_device=execution,
        offload=offload,
        weights_map=weights_map,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        tied_params_map=tied_map,
    )
    _late().retie_parameters(model, tied)
    _guard_moves(model)
    model.__dict__["hf_device_map"] = dict(device_map)
    return model


def _stage_cpu_weights(
    checkpoint: str | os.PathLike[str], device_map: dict[str, Any] | None
) -> bool:
    """Stage cpu weights on disk only when disk is used and shards are read whole (``.bin``)."""
    if device_map is None or "disk" not in device_map.values():
        return False
    return not all(f.endswith(".safetensors") for f in checkpoint_files(checkpoint))


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: str | dict[str, int | str | torch.device] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load a (sharded) checkpoint into ``model`` and dispatch it over the devices.

    Example:
        >>> with init_empty_weights():  # doctest: +SKIP
        ...     model = MyModel(config)
        >>> model = load_checkpoint_and_dispatch(  # doctest: +SKIP
        ...     model, "checkpoint_dir", device_map="auto", no_split_module_classes=["Block"]
        ... )

    Args:
        device_map: name -> device, or ``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
            ``"sequential"`` (planned with ``max_memory`` and ``no_split_module_classes``).
        offload_state_dict: stage cpu weights on disk while loading; by default only when disk
            is used and the checkpoint is ``.bin`` (safetensors is read tensor by tensor).
        The other arguments are those of `load_checkpoint_in_model` and `dispatch_model`.
    """
    device_map = resolve_device_map(
        model,
        device_map,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        offload_buffers=offload_buffers,
    )
    if offload_state_dict is None:
        offload_state_dict = _stage_cpu_weights(checkpoint, device_map)
    _late().load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict=offload_state_dict,
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
    )
    if device_map is None:
        return model
    return _late().dispatch_model(
        model,
        device_map=device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )

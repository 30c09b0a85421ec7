"""Hooks around a module's forward: move inputs, and bring offloaded weights in just in time.

`add_hook_to_module` replaces ``module.forward`` by a wrapper that calls the hook's
``pre_forward``, the original forward, then ``post_forward``. The wrapper keeps the original's
signature (``inspect.signature`` follows ``__wrapped__``), and the attribute names
``_hf_hook`` / ``_old_forward`` are Accelerate's, which transformers' ``generate`` reads.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from hasten.big_modeling.offload import PrefixedDataset
from hasten.big_modeling.tensors import (
    as_device,
    get_non_persistent_buffers,
    named_module_tensors,
    set_module_tensor_to_device,
    split_tensor_name,
)
from hasten.core.nested import find_device, send_to_device

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]

_META = torch.device("meta")


class ModelHook:
    """Base hook: every method is a no-op; subclasses override what they need.

    Attributes:
        no_grad: run the wrapped forward under ``torch.no_grad()``.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called once when the hook is attached; returns the (possibly changed) module."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Called before the forward; returns the ``(args, kwargs)`` to call it with."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward; returns the output to hand back."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; undoes what ``init_hook`` did."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (``post_forward`` in the same order as Accelerate)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    state = module.__dict__  # plain attributes: skips nn.Module.__getattr__ on the hot path
    hook: ModelHook = state["_hf_hook"]
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = state["_old_forward"](*args, **kwargs)
    else:
        output = state["_old_forward"](*args, **kwargs)
    return hook.post_forward(module, output)


# What add_hook_to_module calls on a hook.
_HOOK_METHODS = ("init_hook", "pre_forward", "post_forward", "detach_hook")


def _is_graph_module(module: nn.Module) -> bool:
    # fx GraphModules freeze an instance-level forward; their hook goes on the (per-instance) class
    return "GraphModuleImpl" in str(type(module))


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` (replacing a previous hook unless ``append=True``).

    Returns:
        The module, with ``_hf_hook`` set and ``forward`` wrapped.
    """
    if not isinstance(hook, ModelHook):
        # Accelerate takes any object with the hook methods (duck typing), so does hasten.
        missing = [name for name in _HOOK_METHODS if not callable(getattr(hook, name, None))]
        if missing:
            raise TypeError(
                f"hook must be a ModelHook (or have its methods), got {type(hook).__name__} "
                f"without {', '.join(missing)}; subclass hasten.hooks.ModelHook."
            )
    state = module.__dict__
    if append and state.get("_hf_hook") is not None:
        previous: ModelHook = state["_hf_hook"]
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if "_hf_hook" in state and "_old_forward" in state:
        original = state["_old_forward"]  # already wrapped: keep the true original
    else:
        original = module.forward
        state["_old_forward"] = original
    module = hook.init_hook(module)
    module.__dict__["_hf_hook"] = hook
    wrapped = functools.update_wrapper(functools.partial(_hooked_forward, module), original)
    if _is_graph_module(module):
        type(module).forward = wrapped
    else:
        module.__dict__["forward"] = wrapped
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and of its submodules with ``recurse=True``)."""
    state = module.__dict__
    hook: ModelHook | None = state.pop("_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
    if "_old_forward" in state:
        original = state.pop("_old_forward")
        if _is_graph_module(module):
            type(module).forward = original
        elif getattr(original, "__self__", None) is module and getattr(
            original, "__func__", None
        ) is getattr(type(module), "forward", None):
            state.pop("forward", None)  # back to the class's own method
        else:
            state["forward"] = original
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``: move its inputs, and with ``offload=True`` load
    its weights from ``weights_map`` before the forward and drop them (back to meta) after.

    Args:
        execution_device: where the forward runs.
        offload: keep the weights off the device (meta) between forwards.
        io_same_device: give the output back on the device the inputs came from.
        weights_map: name -> tensor of the offloaded weights (cpu dict or disk loader).
        offload_buffers: offload buffers too (otherwise they live on the execution device).
        place_submodules: cover the tensors of submodules too.
        skip_keys: keys of dict inputs/outputs left where they are.
        tied_params_map: data pointer -> {device: tensor}, so tied weights load once.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, Any] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    ) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.param_original_devices: dict[str, torch.device] = {}
        self.buffer_original_devices: dict[str, torch.device] = {}
        self.tied_pointers_to_remove: set[tuple[int, torch.device]] = set()
        self._device: torch.device | None = None
        self._slots: list[tuple[nn.Module, str, str]] = []

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _place(self, module: nn.Module, name: str, device: torch.device) -> None:
        """Move ``module``'s tensor ``name`` to ``device``, keeping tied weights tied."""
        set_module_tensor_to_device(
            module, name, device, tied_params_map=self.tied_params_map, clear_cache=False
        )

    def init_hook(self, module: nn.Module) -> nn.Module:
        if self.execution_device is not None:
            self._device = as_device(self.execution_device)
            if self._device == _META:
                self.tied_params_map = None
        elif self.offload:
            self._device = torch.device("cpu")  # offloaded weights must be loaded somewhere
        recurse = self.place_submodules
        if not self.offload:
            if self._device is not None:
                for name, _ in named_module_tensors(module, recurse=recurse):
                    self._place(module, name, self._device)
            return module
        for name, param in module.named_parameters(recurse=recurse):
            self.param_original_devices[name] = param.device
        for name, buffer in module.named_buffers(recurse=recurse):
            self.buffer_original_devices[name] = buffer.device
        if self.weights_map is None:
            self.weights_map = {
                name: value.to("cpu")
                for name, value in named_module_tensors(
                    module, include_buffers=self.offload_buffers, recurse=recurse
                )
            }
        # the list of weights to load is fixed here once, not rebuilt on every forward
        for name, _ in named_module_tensors(
            module,
            include_buffers=self.offload_buffers,
            recurse=recurse,
            remove_non_persistent=True,
        ):
            if name in self.weights_map:
                owner, local = split_tensor_name(module, name)
                self._slots.append((owner, local, name))
                set_module_tensor_to_device(owner, local, _META, clear_cache=False)
        if self._device is not None:
            buffers = (
                get_non_persistent_buffers(module, recurse=recurse, fqns=True)
                if self.offload_buffers
                else {name for name, _ in module.named_buffers(recurse=recurse)}
            )
            for name in buffers:
                self._place(module, name, self._device)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        device, weights = self._device, self.weights_map
        if self.offload and device is not None and weights is not None:
            tied = self.tied_params_map
            for owner, local, name in self._slots:
                value = weights[name]
                statistics = None
                if value.dtype == torch.int8 and name.endswith("weight"):
                    statistics = weights.get(name[: -len("weight")] + "SCB")
                if (
                    tied is not None
                    and value.data_ptr() in tied
                    and device not in tied[value.data_ptr()]
                ):
                    self.tied_pointers_to_remove.add((value.data_ptr(), device))
                set_module_tensor_to_device(
                    owner,
                    local,
                    device,
                    value=value,
                    fp16_statistics=statistics,
                    tied_params_map=tied,
                    clear_cache=False,
                )
        if device is None:
            return args, kwargs
        return (
            send_to_device(args, device),
            send_to_device(kwargs, device, skip_keys=self.skip_keys),
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for owner, local, _ in self._slots:
                set_module_tensor_to_device(owner, local, _META, clear_cache=False)
            if self.tied_params_map is not None:
                for pointer, device in self.tied_pointers_to_remove:
                    self.tied_params_map.get(pointer, {}).pop(device, None)
                self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    @contextlib.contextmanager
    def weights_loaded(
        self, module: nn.Module, device: int | str | torch.device | None = None
    ) -> Iterator[None]:
        """Hold the offloaded weights on `device` (default: the execution device) for a block.

        The same loading and dropping a forward does, without running one.
        """
        saved = self.execution_device, self._device
        if device is not None:
            self.execution_device, self._device = device, as_device(device)
        try:
            self.pre_forward(module)
            yield
        finally:
            self.post_forward(module, None)
            self.execution_device, self._device = saved

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload and self.weights_map is not None:
            for owner, local, name in self._slots:
                original = self.param_original_devices.get(
                    name, self.buffer_original_devices.get(name)
                )
                if original is not None and original != _META:
                    set_module_tensor_to_device(
                        owner, local, original, value=self.weights_map[name]
                    )
            self._slots = []
        return module


class CpuOffload(ModelHook):
    """Keep a whole model on cpu and move it to ``execution_device`` when it runs.

    With ``prev_module_hook``, the previous model of a pipeline goes back to cpu first.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.prev_module_hook = prev_module_hook
        if execution_device is None:
            accelerator = (
                torch.accelerator.current_accelerator()
                if torch.accelerator.is_available()
                else None
            )
            execution_device = accelerator if accelerator is not None else "cpu"
        self.execution_device = as_device(execution_device)

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
            if torch.accelerator.is_available():
                torch.accelerator.empty_cache()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device
        )


class UserCpuOffloadHook:
    """Handle returned by `cpu_offload_with_hook`: ``offload()`` sends the model back to cpu."""

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Move the model back to cpu now."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Detach the hook from the model."""
        remove_hook_from_module(self.model)


def _has_tensors(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None or next(module.buffers(), None) is not None


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
) -> None:
    """Give every submodule holding tensors a hook that moves its inputs to ``execution_device``."""
    if not hasattr(module, "_hf_hook") and _has_tensors(module):
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map
            ),
        )
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(
            child, execution_device, skip_keys, preload_module_classes, tied_params_map
        )


def attach_align_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload: bool = False,
    weights_map: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
) -> None:
    """Hook each submodule with its own weights so it loads only those (one layer at a time).

    A module whose class is in ``preload_module_classes`` loads its whole subtree at once.
    """
    own = [n for n, _ in named_module_tensors(module, include_buffers=offload_buffers)]
    whole = preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if own or whole:
        prefix = f"{module_name}." if module_name else ""
        mapped = (
            PrefixedDataset(weights_map, prefix)
            if weights_map is not None and prefix
            else weights_map
        )
        hook = AlignDevicesHook(
            execution_device=execution_device,
            offload=offload,
            weights_map=mapped,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device=execution_device,
            offload=offload,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{name}" if module_name else name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: int | str | torch.device | Mapping[str, Any] | None = None,
    offload: bool | Mapping[str, bool] = False,
    weights_map: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
) -> None:
    """Hook the blocks named in ``execution_device`` / ``offload`` (dicts by module name).

    A block kept on its device gets one hook placing its whole subtree; an offloaded block gets
    one hook per submodule holding weights (loaded just in time). The model itself gets a hook
    that gives outputs back where the inputs came from.
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if offload:
            attach_align_device_hook(
                module,
                execution_device,
                True,
                weights_map,
                offload_buffers,
                module_name,
                skip_keys,
                preload_module_classes,
                tied_params_map,
            )
        else:
            hook = AlignDevicesHook(
                execution_device,
                io_same_device=True,
                skip_keys=skip_keys,
                place_submodules=True,
                tied_params_map=tied_params_map,
            )
            add_hook_to_module(module, hook)
        return
    devices: Mapping[str, Any] = (
        execution_device
        if isinstance(execution_device, Mapping)
        else dict.fromkeys(offload, execution_device)  # type: ignore[arg-type]
    )
    offloads: Mapping[str, bool] = (
        offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    )
    common: dict[str, Any] = {"skip_keys": skip_keys, "tied_params_map": tied_params_map}
    here: Any = devices.get(module_name)
    if module_name in devices and not offloads.get(module_name, False):
        hook = AlignDevicesHook(
            here,
            offload_buffers=offload_buffers,
            io_same_device=module_name == "",
            place_submodules=True,
            **common,
        )
        add_hook_to_module(module, hook)
        attach_execution_device_hook(
            module, here, skip_keys, preload_module_classes, tied_params_map
        )
        return
    if module_name in devices:
        attach_align_device_hook(
            module,
            here,
            True,
            weights_map,
            offload_buffers,
            module_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(
                module, AlignDevicesHook(here, io_same_device=module_name == "", **common)
            )
        attach_execution_device_hook(
            module, here, skip_keys, preload_module_classes, tied_params_map
        )
        return
    _hook_partial_block(
        module, module_name, devices, offloads, weights_map, offload_buffers, common
    )
    for name, child in module.named_children():
        attach_align_device_hook_on_blocks(
            child,
            devices,
            offloads,
            weights_map,
            offload_buffers,
            f"{module_name}.{name}" if module_name else name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )


def _hook_partial_block(
    module: nn.Module,
    module_name: str,
    devices: Mapping[str, Any],
    offloads: Mapping[str, bool],
    weights_map: Mapping[str, Any] | None,
    offload_buffers: bool,
    common: dict[str, Any],
) -> None:
    """A module split by the map: its own tensors are mapped one by one (or it is the model)."""
    prefix = f"{module_name}." if module_name else ""
    own = [prefix + n for n, _ in named_module_tensors(module)]
    mapped = [key for key in own if key in devices]
    if not mapped and module_name:
        return
    device = devices[mapped[0]] if mapped else devices.get("")
    offloaded = any(offloads.get(key, False) for key in mapped)
    view = (
        PrefixedDataset(weights_map, prefix) if weights_map is not None and prefix else weights_map
    )
    hook = AlignDevicesHook(
        device,
        offload=offloaded,
        weights_map=view if offloaded else None,
        offload_buffers=offload_buffers,
        io_same_device=module_name == "",
        **common,
    )
    add_hook_to_module(module, hook)


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and all its submodules."""
    remove_hook_from_module(module, recurse=True)

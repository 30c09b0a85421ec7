"""Finding, moving and re-tying the tensors of a module by their dotted names."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from hasten.big_modeling.device_map import device_for
from hasten.big_modeling.sizes import resolve_dtype

__all__ = [
    "as_device",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "ensure_weights_retied",
    "find_tied_parameters",
    "first_device",
    "get_module_children_bottom_up",
    "get_module_class_from_name",
    "get_non_persistent_buffers",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
    "split_tensor_name",
]

_META = torch.device("meta")
_UNCAST_PREFIXES = ("torch.uint", "torch.int", "torch.bool")
_QUANTIZED_PARAMS = ("Int8Params", "FP4Params", "Params4bit")


def first_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a model without parameters)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def as_device(device: int | str | torch.device) -> torch.device:
    """Turn a device-map value into a ``torch.device`` (an integer is an accelerator index).

    Raises:
        ValueError: for an integer index on a machine without accelerators, or a bad string.
    """
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        accelerator = (
            torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        )
        if accelerator is None:
            raise ValueError(
                f"device {device!r} is an accelerator index, but this machine has no accelerator: "
                "use 'cpu' (or 'disk') in the device map."
            )
        return torch.device(accelerator.type, device)
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{device!r} is not a device: use an index, 'cpu', 'mps', 'cuda:1', ... ({err})"
        ) from err


def split_tensor_name(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """Return the submodule that owns ``tensor_name`` and the tensor's local name.

    Raises:
        ValueError: if a part of the name is missing or names no parameter or buffer.
    """
    owner = module
    path, _, local = tensor_name.rpartition(".")
    if path:
        for part in path.split("."):
            child = (
                owner._modules.get(part) if part in owner._modules else getattr(owner, part, None)
            )
            if not isinstance(child, nn.Module):
                raise ValueError(
                    f"{type(module).__name__} has no submodule {part!r} on the way to "
                    f"{tensor_name!r}; check the name against model.named_parameters()."
                )
            owner = child
    if local not in owner._parameters and local not in owner._buffers:
        raise ValueError(
            f"{type(owner).__name__} has no parameter or buffer named {local!r} "
            f"(full name {tensor_name!r})."
        )
    return owner, local


def _wrap_parameter(old: torch.Tensor, new: torch.Tensor, device: torch.device) -> nn.Parameter:
    cls = type(old)
    if cls is nn.Parameter:
        return nn.Parameter(new, requires_grad=old.requires_grad)
    extra = {k: v for k, v in old.__dict__.items() if not k.startswith("_")}
    if cls.__name__ in _QUANTIZED_PARAMS:
        # bitsandbytes quantizes when its parameter class is moved to the device
        if cls.__name__ == "Int8Params" and new.dtype == torch.float32:
            new = new.to(torch.float16)
        factory: Any = cls
        if device.type == "meta":
            return factory(new, requires_grad=old.requires_grad, **extra)
        made = factory(new.to("cpu"), requires_grad=old.requires_grad, **extra)
        return made.to(device)
    try:
        made = nn.Parameter(new, requires_grad=old.requires_grad)
        if cls is not nn.Parameter:
            factory = cls
            made = factory(new, requires_grad=old.requires_grad)
    except TypeError:
        made = nn.Parameter(new, requires_grad=old.requires_grad)
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def _tied_lookup(
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None,
    tensors: tuple[torch.Tensor | None, ...],
    device: torch.device,
) -> torch.Tensor | None:
    if tied_params_map is None:
        return None
    for tensor in tensors:
        if tensor is not None and tensor.device != _META:
            found = tied_params_map.get(tensor.data_ptr())
            if found is not None and device in found:
                return found[device]
    return None


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: torch.HalfTensor | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put one parameter or buffer of ``module`` on ``device``, optionally with a new value.

    ``param.to(device)`` makes a new tensor that the module does not see; this swaps the
    module's own entry instead, keeping the parameter class and ``requires_grad``.

    Args:
        module: the module the dotted ``tensor_name`` is relative to.
        tensor_name: full dotted name of the parameter or buffer.
        device: target device (index, string or ``torch.device``).
        value: new value; required when the tensor is on the meta device.
        dtype: cast floating values to this dtype; by default values take the current dtype.
        fp16_statistics: 8-bit quantization statistics (``SCB``) to attach.
        tied_params_map: data pointer -> {device: tensor} of tied weights already placed, so a
            tied weight is placed once per device.
        non_blocking: asynchronous copy where supported.
        clear_cache: empty the accelerator cache afterwards.

    Raises:
        ValueError: for an unknown name, a meta tensor without value, or a shape mismatch.
    """
    owner, local = split_tensor_name(module, tensor_name)
    is_buffer = local in owner._buffers
    old = owner._buffers[local] if is_buffer else owner._parameters[local]
    if old is None:
        raise ValueError(f"{tensor_name!r} is None in {type(owner).__name__}; nothing to move.")
    target = as_device(device)
    reused = _tied_lookup(tied_params_map, (value, old), target)
    if reused is not None:
        owner._parameters[local] = reused  # type: ignore[assignment]
        return
    if value is None and old.device == _META and target != _META:
        raise ValueError(
            f"{tensor_name!r} is on the meta device (it has no data): pass `value=` to put it "
            f"on {target}."
        )
    with torch.no_grad():
        new = _new_value(tensor_name, old, value, dtype, target, non_blocking)
        if is_buffer:
            owner._buffers[local] = new
        elif value is not None or new is not old:
            owner._parameters[local] = _wrap_parameter(old, new, target)
            if fp16_statistics is not None:
                owner._parameters[local].SCB = fp16_statistics.to(target)  # type: ignore[union-attr]
    if clear_cache and target.type not in ("cpu", "meta") and torch.accelerator.is_available():
        torch.accelerator.empty_cache()
    if tied_params_map is not None:
        placed = owner._buffers[local] if is_buffer else owner._parameters[local]
        for source in (old, value):
            if source is not None and source.device != _META:
                slot = tied_params_map.get(source.data_ptr())
                if slot is not None and target not in slot:
                    slot[target] = placed  # type: ignore[assignment]


def _new_value(
    tensor_name: str,
    old: torch.Tensor,
    value: torch.Tensor | None,
    dtype: str | torch.dtype | None,
    target: torch.device,
    non_blocking: bool,
) -> torch.Tensor:
    if value is None:
        new = old.to(target, non_blocking=non_blocking)
        if dtype is not None and not str(old.dtype).startswith(_UNCAST_PREFIXES):
            new = new.to(resolve_dtype(dtype))
        return new
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value)
    if old.shape != value.shape and type(old).__name__ != "Params4bit":
        # Accelerate's sentence, exactly: its test_set_module_tensor_checks_shape compares it whole.
        raise ValueError(
            f'Trying to set a tensor of shape {value.shape} in "{tensor_name.rsplit(".", 1)[-1]}" '
            f"(which has shape {old.shape}), this looks incorrect."
        )
    if dtype is None:
        # as torch's load_state_dict does: a value takes the dtype the model declares
        cast = old.dtype
    elif str(value.dtype).startswith(_UNCAST_PREFIXES):
        cast = value.dtype
    else:
        cast = resolve_dtype(dtype)
    return value.to(device=target, dtype=cast, non_blocking=non_blocking)


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for the parameters, then (optionally) the buffers of a module.

    Args:
        include_buffers: yield buffers too.
        recurse: include submodules' tensors (dotted names).
        remove_non_persistent: skip buffers that are not saved in the state dict.
    """
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = (
            get_non_persistent_buffers(module, recurse=recurse, fqns=True)
            if remove_non_persistent
            else set()
        )
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skip:
                yield name, buffer


def get_non_persistent_buffers(
    module: nn.Module, recurse: bool = False, fqns: bool = False
) -> set[str]:
    """Return the names of buffers registered with ``persistent=False`` (a new set).

    Args:
        recurse: look into submodules too.
        fqns: give submodules' buffers their dotted names (``"sub.buf"``); without it the
            names are the buffers' own, as Accelerate returns them.
    """
    found: set[str] = set()
    modules = module.named_modules() if recurse else [("", module)]
    for prefix, sub in modules:
        for name in sub._non_persistent_buffers_set:
            found.add(f"{prefix}.{name}" if prefix and fqns else name)
    return found


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Return the groups of parameter names that share one tensor, each group sorted.

    Example:
        >>> lin = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> lin[1].weight = lin[0].weight
        >>> find_tied_parameters(lin)
        [['0.weight', '1.weight']]
    """
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [sorted(set(names)) for names in groups.values() if len(set(names)) > 1]


def _get(model: nn.Module, name: str) -> Any:
    owner, local = split_tensor_name(model, name)
    return owner, local, owner._parameters.get(local)


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group point at the group's first non-meta parameter again.

    Moving tied parameters one by one (to meta and back, as offloading does) breaks the tie.
    """
    for group in tied_params:
        anchor = None
        for name in group:
            _, _, param = _get(model, name)
            if param is not None and param.device != _META:
                anchor = param
                break
        if anchor is None:
            continue
        for name in group:
            owner, local, _ = _get(model, name)
            owner._parameters[local] = anchor


def check_tied_parameters_on_same_device(
    tied_params: list[list[str]], device_map: Mapping[str, Any]
) -> None:
    """Warn when a device map separates parameters that are tied together."""
    for group in tied_params:
        devices = {str(device_for(name, device_map)) for name in group}
        if len(devices) > 1:
            warnings.warn(
                f"Tied parameters {group} are placed on different devices ({sorted(devices)}); "
                "they will be duplicated. Put their modules on one device.",
                stacklevel=2,
            )


def get_module_children_bottom_up(
    model: nn.Module, return_fqns: bool = False
) -> list[nn.Module] | list[tuple[str, nn.Module]]:
    """Return every submodule so that children come before their parents; the model is last.

    Args:
        return_fqns: return ``(dotted name, module)`` pairs instead of modules.
    """
    order: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        name, current = stack.pop()
        order.append((name, current))
        for child_name, child in current.named_children():
            stack.append((f"{name}.{child_name}" if name else child_name, child))
    order.reverse()
    if return_fqns:
        return order
    return [module for _, module in order]


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """Return whether two devices are the same, counting ``cuda`` as ``cuda:0`` (torch does not)."""
    if first_device.type != second_device.type:
        return False

    def indexed(device: torch.device) -> torch.device:
        if device.type != "cpu" and device.index is None:
            return torch.device(device.type, 0)
        return device

    return indexed(first_device) == indexed(second_device)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Return whether a transformers model says some of its weights should be tied.

    Reads what ``PreTrainedModel.tie_weights`` would act on: ``tie_word_embeddings`` with output
    embeddings, ``tie_encoder_decoder`` on an encoder-decoder, or a module with ``_tie_weights``.
    Any other model answers False.
    """
    if "PreTrainedModel" not in [cls.__name__ for cls in inspect.getmro(type(model))]:
        return False
    config = getattr(model, "config", None)
    decoder_config = config
    if config is not None and hasattr(config, "get_text_config"):
        decoder_config = config.get_text_config(decoder=True)
    word_embeddings = bool(
        decoder_config is not None
        and getattr(decoder_config, "tie_word_embeddings", False)
        and model.get_output_embeddings()  # type: ignore[operator]
    )
    encoder_decoder = bool(
        getattr(config, "is_encoder_decoder", False)
        and getattr(config, "tie_encoder_decoder", False)
    )
    tied_module = any(hasattr(module, "_tie_weights") for module in model.modules())
    return word_embeddings or encoder_decoder or tied_module


def ensure_weights_retied(
    param_init_fn: Callable[[nn.Module], nn.Module], model: nn.Module, device: torch.device
) -> Callable[[nn.Module], nn.Module]:
    """Wrap `param_init_fn` so parameters tied in `model` (``_tied_weights_keys``) stay tied.

    An init function that allocates fresh parameters (FSDP's ``param_init_fn`` on a meta model)
    would otherwise give each tied name its own tensor: the wrapper ties every later occurrence
    to the first one initialised. Without ``_tied_weights_keys`` `param_init_fn` is returned.
    """
    del device  # Accelerate's signature; the parameters are re-tied wherever init put them
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    tied: dict[int, nn.Parameter | None] = {}
    for name in tied_names:
        owner, _, attribute = name.rpartition(".")
        tied[id(getattr(model.get_submodule(owner), attribute))] = None

    def init_keeping_ties(module: nn.Module) -> nn.Module:
        to_tie = [
            (key, name)
            for name, param in module.named_parameters(recurse=False)
            if (key := id(param)) in tied
        ]
        module = param_init_fn(module)
        for key, name in to_tie:
            first = tied[key]
            if first is None:
                tied[key] = getattr(module, name)
            else:
                setattr(module, name, first)
        return module

    return init_keeping_ties


def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """Return the class named `name` among `module` and its submodules (depth first), or None."""
    for sub in module.modules():
        if type(sub).__name__ == name:
            return type(sub)
    return None

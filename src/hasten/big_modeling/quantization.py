"""8-bit and 4-bit quantization of ``nn.Linear`` layers with bitsandbytes (an optional extra).

The linear layers are swapped for bitsandbytes layers (on the meta device when the model is
empty); weights are quantized as they are loaded onto their device. Modules listed in
``skip_modules`` / ``keep_in_fp32_modules`` (by default the tied and output layers) stay as
they are.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hasten.big_modeling.device_map import (
    get_balanced_memory,
    infer_auto_device_map,
    validate_device,
)
from hasten.big_modeling.dispatch import dispatch_model
from hasten.big_modeling.init import init_empty_weights
from hasten.big_modeling.loading import load_checkpoint_in_model
from hasten.big_modeling.offload import offload_weight
from hasten.big_modeling.tensors import (
    find_tied_parameters,
    first_device,
    set_module_tensor_to_device,
    split_tensor_name,
)
from hasten.config.enums import CustomDtype
from hasten.config.quantization import BnbQuantizationConfig
from hasten.core.imports import require

__all__ = [
    "check_quantized_placement",
    "get_keys_to_not_convert",
    "get_parameter_device",
    "get_quantized_model_device_map",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
    "quantize_and_offload_8bit",
    "replace_with_bnb_layers",
]

logger = logging.getLogger(__name__)
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _bitsandbytes() -> ModuleType:
    # optional: bitsandbytes
    return require("bitsandbytes", feature="load_and_quantize_model", extra="bnb")


def _skipped(name: str, skip: list[str]) -> bool:
    return any(
        name == key or name.startswith(key + ".") or f".{key}." in f".{name}." for key in skip
    )


def _quantized_linear(
    bnb: ModuleType, module: nn.Linear, config: BnbQuantizationConfig
) -> nn.Module:
    bias = module.bias is not None
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(
            module.in_features,
            module.out_features,
            bias,
            has_fp16_weights=False,
            threshold=config.llm_int8_threshold,
        )
    else:
        layer = bnb.nn.Linear4bit(
            module.in_features,
            module.out_features,
            bias,
            config.bnb_4bit_compute_dtype,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
        )
    layer.weight.data = module.weight.data
    if bias:
        layer.bias.data = module.bias.data
    layer.requires_grad_(False)
    return layer


def replace_with_bnb_layers(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: list[str] | None = None,
    current_key_name: list[str] | None = None,
) -> nn.Module:
    """Swap every ``nn.Linear`` (except the skipped ones) for its bitsandbytes counterpart."""
    bnb = _bitsandbytes()
    skip = list(modules_to_not_convert or [])
    prefix = ".".join(current_key_name or [])
    replaced = 0
    for name, module in list(model.named_modules()):
        full = f"{prefix}.{name}" if prefix and name else prefix or name
        if name and isinstance(module, nn.Linear) and not _skipped(full, skip):
            parent_name, _, local = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, local, _quantized_linear(bnb, module, bnb_quantization_config))
            replaced += 1
    if not replaced:
        logger.warning(
            "no nn.Linear layer was quantized (some architectures, like GPT-2, use Conv1D)"
        )
    return model


def check_quantized_placement(
    device_map: dict[str, Any], device: torch.device, *, distributed: bool, cpu_supported: bool
) -> None:
    """Refuse to train an 8/4-bit model from where bitsandbytes cannot train it.

    Args:
        device_map: the model's ``hf_device_map`` (where its layers were loaded).
        device: the device this process trains on.
        distributed: several processes train (a layer split over devices cannot be replicated).
        cpu_supported: bitsandbytes can train on the CPU (its multi-backend build, not on XPU).

    Raises:
        ValueError: layers on several devices in a distributed run, the model on another
            accelerator than this process's, or layers on the CPU (without CPU support) or disk.
    """
    devices = set(device_map.values())
    if len(devices) > 1 and distributed:
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision on multiple "
            "devices in any distributed mode. (hasten: its layers sit on "
            f"{sorted(map(str, devices))}; load it whole on each process's device, e.g. "
            "device_map={'': accelerator.device}, or train it in a single process.)"
        )
    if len(devices) == 1 and not (device.type == "cpu" and cpu_supported):
        (where,) = devices
        index = torch.device(where).index if isinstance(where, (str, torch.device)) else where
        if torch.device(device.type, index) != device and (device.index is not None or index != 0):
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision on a "
                f"different device than the one you're training on. (hasten: it is on {where!r}, "
                f"this process trains on {device}; load it with device_map={{'': "
                "accelerator.device}.)"
            )
    if ("cpu" in devices and not cpu_supported) or "disk" in devices:
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU "
            "or disk offload. (hasten: bitsandbytes trains quantized layers only on the "
            "accelerator here; load the model without offload, or install a bitsandbytes build "
            "with CPU support to train on the CPU.)"
        )


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """Names of modules best left unquantized: tied weights' modules and the output layer."""
    tied = find_tied_parameters(model)
    tied_keys = [name for group in tied for name in group]
    base_prefix = getattr(model, "base_model_prefix", None)
    is_base_model = bool(base_prefix) and not hasattr(model, base_prefix)  # type: ignore[arg-type]
    if not tied_keys and is_base_model:
        return []
    children = list(model.named_children())
    if not children:
        return []
    keep = {children[-1][0]}
    for name in tied_keys:
        keep.add(name.rpartition(".")[0])
    return sorted(k for k in keep if k)


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Whether the model holds bitsandbytes 4-bit linear layers."""
    bnb = _bitsandbytes()
    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def _default_device() -> str | int:
    return 0 if torch.accelerator.is_available() else "cpu"


def _cast_unquantized(model: nn.Module, dtype: torch.dtype, keep_fp32: list[str]) -> None:
    for name, param in model.named_parameters(remove_duplicate=False):
        if not param.is_floating_point():
            continue
        target = torch.float32 if _skipped(name.rpartition(".")[0], keep_fp32) else dtype
        param.data = param.data.to(target)


def _plan(
    model: nn.Module,
    config: BnbQuantizationConfig,
    device_map: Any,
    max_memory: dict[int | str, int | str] | None,
    no_split_module_classes: list[str] | None,
    keep_fp32: list[str],
) -> dict[str, Any]:
    """Plan a map counting quantized weights at 1 byte (8-bit) or half a byte (4-bit)."""
    if device_map is None:
        return {"": _default_device()}
    if isinstance(device_map, dict):
        for key, device in device_map.items():
            validate_device(device, key)
        return device_map
    if device_map not in _STRATEGIES:
        raise ValueError(f"device_map={device_map!r} must be a dict or one of {_STRATEGIES!r}")
    quantized = torch.int8 if config.load_in_8bit else CustomDtype.INT4
    special: dict[str, Any] = {}
    for name, param in model.named_parameters():
        owner = name.rpartition(".")[0]
        if _skipped(owner, keep_fp32):
            special[name] = torch.float32
        elif type(param).__name__ in ("Int8Params", "Params4bit"):
            special[name] = quantized
    if device_map != "sequential":
        max_memory = get_balanced_memory(  # type: ignore[assignment]
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=config.torch_dtype,
            special_dtypes=special,
            low_zero=device_map == "balanced_low_0",
        )
    return infer_auto_device_map(
        model,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=config.torch_dtype,
        special_dtypes=special,
    )


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """Return the device of `parameter`'s first parameter (a module's "where it lives").

    Raises:
        ValueError: the module has no parameters.
    """
    first = next(parameter.parameters(), None)
    if first is None:
        raise ValueError(f"{type(parameter).__name__} has no parameters, so it has no device")
    return first.device


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: Any = None,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> dict[str, Any]:
    """Plan where each module of a model being quantized goes, counting quantized weights small.

    `device_map` may be a dict (checked), a strategy name (``"auto"``, ``"balanced"``,
    ``"balanced_low_0"``, ``"sequential"``) or None (everything on the first accelerator, or
    the CPU, where bitsandbytes also runs).

    Raises:
        ValueError: an unknown strategy, or 4-bit modules planned onto the CPU or disk (4-bit
            weights cannot be offloaded; pass a map keeping those modules unquantized).
    """
    config = bnb_quantization_config
    keep_fp32 = list(config.keep_in_fp32_modules or [])
    planned = _plan(model, config, device_map, max_memory, no_split_module_classes, keep_fp32)
    skipped = list(config.skip_modules or []) + keep_fp32
    offloaded = sorted(
        key
        for key, device in planned.items()
        if str(device) in ("cpu", "disk") and not _skipped(key, skipped)
    )
    on_accelerator = any(str(device) not in ("cpu", "disk") for device in planned.values())
    if offloaded and on_accelerator:
        if config.load_in_4bit:
            raise ValueError(
                f"Modules {offloaded} are planned onto the CPU or disk, but 4-bit weights cannot "
                "be offloaded. Give the accelerator more max_memory, or pass a device_map that "
                "offloads only modules listed in skip_modules/keep_in_fp32_modules."
            )
        logger.info("Modules %s are offloaded; they will be converted to 8-bit", offloaded)
    return planned


def quantize_and_offload_8bit(
    model: nn.Module,
    param: torch.Tensor,
    param_name: str,
    new_dtype: torch.dtype | str | None,
    offload_folder: str | os.PathLike[str],
    offload_index: dict[str, Any],
    fp16_statistics: torch.Tensor | None,
) -> None:
    """Quantize weight `param_name` to 8 bits, write it (and its ``SCB`` scales) to `offload_folder`.

    A weight without `fp16_statistics` is quantized by placing it on the compute device (as a
    bitsandbytes ``Int8Params``); an already quantized one is written as it is with its
    statistics. Afterwards the model holds a meta placeholder, and `offload_index` lists both.
    """
    if fp16_statistics is None:
        set_module_tensor_to_device(
            model, param_name, _default_device(), value=param, dtype=new_dtype
        )
        owner, local = split_tensor_name(model, param_name)
        quantized = owner._parameters[local]
        if quantized is None:
            raise ValueError(f"{param_name!r} is not a parameter of the model; cannot quantize it")
        quantized.requires_grad = False
        offload_weight(quantized, param_name, offload_folder, index=offload_index)
        scales = getattr(quantized, "SCB", None)
        if scales is not None:
            scb_name = param_name.replace("weight", "SCB")
            offload_weight(scales, scb_name, offload_folder, index=offload_index)
    else:
        offload_weight(param, param_name, offload_folder, index=offload_index)
        scb_name = param_name.replace("weight", "SCB")
        offload_weight(fp16_statistics, scb_name, offload_folder, index=offload_index)
    placeholder = torch.empty(*param.size())
    set_module_tensor_to_device(model, param_name, "meta", dtype=new_dtype, value=placeholder)


def load_and_quantize_model(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: str | os.PathLike[str] | None = None,
    device_map: dict[str, int | str | torch.device] | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_state_dict: bool = False,
) -> nn.Module:
    """Quantize ``model`` with bitsandbytes; load and dispatch its weights if it is empty.

    A model on the meta device is converted, loaded from ``weights_location`` and dispatched
    per ``device_map`` (a dict or ``"auto"``/``"balanced"``/...). A loaded model is quantized
    in place and moved to the first accelerator (or kept on cpu where bitsandbytes runs there).

    Raises:
        ImportError: bitsandbytes is not installed (the message gives the pip command).
        TypeError: the config is not a `BnbQuantizationConfig`.
        ValueError: an empty model without ``weights_location``.
    """
    if not isinstance(bnb_quantization_config, BnbQuantizationConfig):
        raise TypeError(
            "bnb_quantization_config must be a BnbQuantizationConfig, got "
            f"{type(bnb_quantization_config).__name__}"
        )
    _bitsandbytes()
    config = bnb_quantization_config
    skip = (
        list(config.skip_modules)
        if config.skip_modules is not None
        else get_keys_to_not_convert(model)
    )
    if config.load_in_4bit and isinstance(device_map, dict) and len(device_map) > 1:
        # 4-bit layers cannot be offloaded: keep offloaded modules unquantized (cpu is an
        # offload target only when an accelerator runs the model)
        runs_on_host = all(str(v) in ("cpu", "disk") for v in device_map.values())
        offloaded = ("disk",) if runs_on_host else ("cpu", "disk")
        skip += [k for k, v in device_map.items() if v in offloaded]
    keep_fp32 = list(config.keep_in_fp32_modules or [])
    skip += keep_fp32
    dtype = config.torch_dtype
    if first_device(model).type != "meta":
        logger.warning(
            "quantizing an already loaded model: build it under init_empty_weights instead"
        )
        replace_with_bnb_layers(model, config, modules_to_not_convert=skip)
        _cast_unquantized(model, dtype, keep_fp32)
        accelerator = torch.accelerator.current_accelerator()
        model.to(torch.device(accelerator.type, 0) if accelerator is not None else "cpu")
        model.__dict__.update(
            is_loaded_in_8bit=config.load_in_8bit, is_loaded_in_4bit=config.load_in_4bit
        )
        return model
    if weights_location is None:
        raise ValueError(
            "the model is on the meta device, so load_and_quantize_model needs "
            "weights_location= (a checkpoint file, index .json or folder) to load it."
        )
    with init_empty_weights():
        replace_with_bnb_layers(model, config, modules_to_not_convert=skip)
    planned = _plan(model, config, device_map, max_memory, no_split_module_classes, keep_fp32)
    load_checkpoint_in_model(
        model,
        weights_location,
        device_map=planned,
        dtype=dtype,
        offload_folder=offload_folder,
        offload_state_dict=offload_state_dict,
        keep_in_fp32_modules=keep_fp32,
        offload_8bit_bnb=config.load_in_8bit,
    )
    model.__dict__.update(
        is_loaded_in_8bit=config.load_in_8bit, is_loaded_in_4bit=config.load_in_4bit
    )
    return dispatch_model(model, device_map=planned, offload_dir=offload_folder)

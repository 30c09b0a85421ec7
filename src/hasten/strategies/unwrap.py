"""Recover the user's model from the containers hasten (or the user) wrapped it in.

Knows three kinds of wrapper: data-parallel containers (`DistributedDataParallel`,
`DataParallel`, FSDP when torch.distributed is built), `torch.compile`'s `OptimizedModule`, and
the mixed-precision forward wrapper, which by convention keeps the original bound forward in the
instance attribute ``_original_forward``.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

import torch
from torch import nn

from hasten.core.imports import is_package_available

__all__ = [
    "extract_model_from_parallel",
    "is_compiled_module",
    "is_peft_model",
    "parallel_containers",
]

_CONTAINERS: tuple[type[nn.Module], ...] | None = None


def parallel_containers() -> tuple[type[nn.Module], ...]:
    """Return the module classes that hold the real model in their ``.module`` attribute."""
    global _CONTAINERS
    if _CONTAINERS is None:
        found: list[type[nn.Module]] = [nn.parallel.DistributedDataParallel, nn.DataParallel]
        if torch.distributed.is_available():
            from torch.distributed.fsdp import FullyShardedDataParallel

            found.append(FullyShardedDataParallel)
        _CONTAINERS = tuple(found)
    return _CONTAINERS


def is_compiled_module(module: Any) -> bool:
    """Tell whether ``module`` is the wrapper returned by ``torch.compile(model)``."""
    compiled_cls = getattr(torch._dynamo.eval_frame, "OptimizedModule", None)
    return compiled_cls is not None and isinstance(module, compiled_cls)


def _unwrap_children(module: nn.Module, containers: tuple[type[nn.Module], ...]) -> nn.Module:
    while isinstance(module, containers) or (
        hasattr(module, "module") and isinstance(module.module, nn.Module)
    ):
        module = cast(nn.Module, module.module)
    for name, child in list(module.named_children()):
        setattr(module, name, _unwrap_children(child, containers))
    return module


def _drop_fp32_forward(model: nn.Module) -> None:
    original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return
    if getattr(original, "__func__", None) is type(model).forward:
        # The class's own forward: deleting the instance attribute restores it and keeps the
        # model picklable without a bound-method reference to itself.
        model.__dict__.pop("forward", None)
    else:
        model.forward = original


def _regional_original(module: nn.Module) -> nn.Module | None:
    """The original behind a `compile_regions` copy (kept in its ``__dict__``), else None."""
    original = module.__dict__.get("_orig_mod")
    return original if isinstance(original, nn.Module) and not is_compiled_module(module) else None


def extract_model_from_parallel(
    model: nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> nn.Module:
    """Return the model inside DDP/DataParallel/FSDP (and optionally compile/fp32) wrappers.

    Args:
        model: the possibly wrapped model.
        keep_fp32_wrapper: keep the mixed-precision forward (False restores the original forward).
        keep_torch_compile: keep the `torch.compile` wrapper around the result (and return a
            `compile_regions` copy itself rather than its original).
        recursive: also unwrap every submodule that is itself a ``.module`` container.

    Returns:
        The innermost model, re-wrapped in its compiled form when ``keep_torch_compile``.
    """
    compiled = None
    if is_compiled_module(model):
        compiled, model = model, cast(nn.Module, model._orig_mod)
    inner = model
    containers = parallel_containers()
    while isinstance(model, containers):
        model = cast(nn.Module, model.module)
    original = _regional_original(model)
    if original is not None and not keep_torch_compile:
        # A `compile_regions` copy (or the copied inner model of a copied container): the
        # uncompiled original it was made from, with the original's parameter names.
        model = original
    if recursive:
        model = _unwrap_children(model, containers)
    if not keep_fp32_wrapper:
        _drop_fp32_forward(model)
    if compiled is None or not keep_torch_compile:
        return model
    if model is inner:
        return compiled
    # A fresh compiled wrapper around the bare model with the same compile settings; the one the
    # user trains with (around DDP) is left untouched.
    return type(compiled)(model, compiled.dynamo_ctx)


def is_peft_model(model: Any) -> bool:
    """Return whether `model` (once unwrapped from DDP/compile) is a peft ``PeftModel``.

    False without peft installed; peft is imported only when it is.
    """
    if not is_package_available("peft"):
        return False
    peft = importlib.import_module("peft")  # optional: peft
    return isinstance(extract_model_from_parallel(model), peft.PeftModel)

"""Layerwise casting: keep weights in a small storage dtype, compute in a wider one.

Each supported layer (convolutions, linear) keeps its parameters in ``storage_dtype`` (for
instance ``torch.float8_e4m3fn`` or ``torch.bfloat16``) and is cast to ``compute_dtype`` just
for its own forward, then back. Only one layer at a time holds wide weights, so the model's
resident parameter memory is the storage dtype's.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from hasten.big_modeling.hooks import ModelHook, add_hook_to_module

__all__ = [
    "LayerwiseCastingHook",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "attach_layerwise_casting_hooks",
]

# Layers whose weights are cast (Accelerate's list): the ones that hold the bulk of a model's
# parameters and have no dtype-sensitive statistics (norms and embeddings are left alone).
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
    torch.nn.Linear,
)


def _check_dtype(name: str, dtype: Any) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"{name} must be a floating-point torch.dtype (e.g. torch.float8_e4m3fn, "
            f"torch.bfloat16, torch.float32), got {dtype!r}"
        )


class LayerwiseCastingHook(ModelHook):
    """Store a module's weights in ``storage_dtype``; cast them to ``compute_dtype`` for its
    forward and back afterwards (the parameter objects stay the same, only their data changes).
    """

    def __init__(
        self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool
    ) -> None:
        _check_dtype("storage_dtype", storage_dtype)
        _check_dtype("compute_dtype", compute_dtype)
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def __repr__(self) -> str:
        return (
            f"LayerwiseCastingHook(storage_dtype={self.storage_dtype}, "
            f"compute_dtype={self.compute_dtype}, non_blocking={self.non_blocking})"
        )

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def _patterns(skip_modules_pattern: str | tuple[str, ...] | None) -> tuple[re.Pattern[str], ...]:
    if skip_modules_pattern is None:
        return ()
    raw = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern
    if not all(isinstance(p, str) for p in raw):
        raise TypeError(
            "skip_modules_pattern must be a regex string or a tuple of them, got "
            f"{skip_modules_pattern!r}"
        )
    try:
        return tuple(re.compile(p) for p in raw)
    except re.error as exc:
        raise ValueError(
            f"skip_modules_pattern {exc.pattern!r} is not a valid regex: {exc}"
        ) from exc


def attach_layerwise_casting_hooks(
    module: torch.nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | None = None,
    skip_modules_classes: tuple[type[torch.nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Give every supported layer of ``module`` a `LayerwiseCastingHook`, in place.

    Args:
        module: the model (or any module) to cast.
        storage_dtype: dtype the weights are kept in between forwards.
        compute_dtype: dtype each layer's forward runs in (inputs must already be in it).
        skip_modules_pattern: regexes searched in the qualified module names; matching
            modules (and their children) keep their dtype.
        skip_modules_classes: module classes (and their children) that keep their dtype.
        non_blocking: cast asynchronously where the device allows it.
    """
    _check_dtype("storage_dtype", storage_dtype)
    _check_dtype("compute_dtype", compute_dtype)
    patterns = _patterns(skip_modules_pattern)
    classes = tuple(skip_modules_classes or ())
    stack: list[tuple[str, nn.Module]] = [("", module)]
    while stack:
        name, current = stack.pop()
        if (classes and isinstance(current, classes)) or any(p.search(name) for p in patterns):
            continue
        if isinstance(current, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            hook = LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking)
            add_hook_to_module(current, hook, append=True)
            continue
        for child_name, child in current.named_children():
            stack.append((f"{name}.{child_name}" if name else child_name, child))

"""fp8 training with torchao: swap `nn.Linear` layers for torchao's `Float8Linear`.

`Float8Linear` keeps the original weight and bias parameters (the optimizer needs no update);
its matmuls run in fp8 with dynamic scaling. The first and last Linear layers of a model are
left in high precision by default (a known stability rule for fp8 training), and so are layers
whose sizes are not multiples of 16 (what fp8 matmul kernels need). torchao is imported only
when a conversion or check runs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from hasten.core.imports import require

__all__ = [
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
]

_FEATURE = "fp8 training with torchao"


def _float8() -> Any:
    # optional: torchao
    return require("torchao.float8", feature=_FEATURE, extra="fp8", pip_name="torchao")


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """Return the qualified names of the first and last `nn.Linear` in ``model`` (None if none)."""
    first: str | None = None
    last: str | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if first is None:
                first = name
            last = name
    return first, last


def filter_linear_layers(module: Any, fqn: str, layers_to_filter: list[str]) -> bool:
    """Module filter for torchao: True when ``module`` (named ``fqn``) should become fp8.

    A Linear whose in/out features are not multiples of 16 stays as it is (fp8 kernels need
    them), and so does every layer named in ``layers_to_filter``.
    """
    if isinstance(module, nn.Linear) and (
        module.in_features % 16 != 0 or module.out_features % 16 != 0
    ):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: Any, fqn: str) -> bool:
    """Module filter that leaves the first and last Linear of ``module`` in high precision.

    Like Accelerate's, it looks for the first and last Linear inside ``module`` itself; to skip
    those of a whole model, `convert_model_to_fp8_ao`'s default filter does it from the root.
    """
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[n for n in (first, last) if n])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Return whether ``model`` holds any torchao `Float8Linear` layer.

    Raises:
        ImportError: torchao is not installed (the message says how to install it).
    """
    float8_linear = _float8().float8_linear.Float8Linear
    return any(isinstance(module, float8_linear) for module in model.modules())


def convert_model_to_fp8_ao(
    model: torch.nn.Module,
    config: Any = None,
    module_filter_func: Callable[..., bool] | None = None,
) -> torch.nn.Module:
    """Convert ``model``'s Linear layers to torchao fp8 training layers, in place.

    Args:
        model: the model to convert (weights stay the same parameter objects).
        config: a `torchao.float8.Float8LinearConfig` (None: torchao's default).
        module_filter_func: ``(module, fqn) -> bool`` choosing the layers to convert; the
            default keeps the model's first and last Linear and odd-sized ones in high precision.

    Returns:
        ``model`` itself.

    Raises:
        ImportError: torchao is not installed.
    """
    float8 = _float8()
    if module_filter_func is None:
        first, last = find_first_last_linear_layers(model)
        skipped = [name for name in (first, last) if name is not None]
        module_filter_func = partial(filter_linear_layers, layers_to_filter=skipped)
    float8.convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
    return model

"""LOMO / AdaLomo (package ``lomo-optim``): backward and parameter update fused in one pass.

These optimizers update each parameter from inside its gradient hook, so the training step is
``accelerator.lomo_backward(loss, lr)`` instead of ``backward`` + ``optimizer.step()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from hasten.core.imports import is_lomo_available, require
from hasten.optimizer import unwrap_optimizer

__all__ = ["is_lomo_optimizer", "lomo_backward"]


def is_lomo_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` (or the optimizer it wraps) is a `Lomo` or `AdaLomo`."""
    if not is_lomo_available():
        return False
    lomo = require("lomo_optim", feature="LOMO optimizers", pip_name="lomo-optim")  # optional
    inner = unwrap_optimizer(optimizer)
    return isinstance(inner, (lomo.Lomo, lomo.AdaLomo))


def lomo_backward(optimizers: Sequence[Any], loss: torch.Tensor, learning_rate: float) -> None:
    """Run the fused backward + update of the one prepared LOMO optimizer at ``learning_rate``.

    Raises:
        ImportError: lomo-optim is not installed.
        ValueError: no learning rate, or not exactly one LOMO optimizer was prepared.
        TypeError: the learning rate is not a finite number.
    """
    require("lomo_optim", feature="Accelerator.lomo_backward", pip_name="lomo-optim")
    if learning_rate is None:
        raise ValueError(
            "A learning rate must be passed in order to call backward pass with LOMO "
            "optimizers: accelerator.lomo_backward(loss, learning_rate=...)."
        )
    if (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float))
        or not math.isfinite(learning_rate)
    ):
        raise TypeError(f"learning_rate must be a finite number, got {learning_rate!r}")
    targets = [opt for opt in optimizers if is_lomo_optimizer(opt)]
    if not targets:
        raise ValueError(
            "Backward pass not properly called on LOMO optimizers: none was prepared. Pass a "
            "lomo_optim.Lomo or AdaLomo to accelerator.prepare(), or use accelerator.backward()."
        )
    if len(targets) > 1:
        raise ValueError(
            f"{len(targets)} LOMO optimizers were prepared, but one loss can be backpropagated "
            "only once: build one Lomo/AdaLomo over the whole model."
        )
    inner: Any = unwrap_optimizer(targets[0])  # a Lomo / AdaLomo
    inner.fused_backward(loss, learning_rate)

"""The pieces of `Accelerator.prepare` that do not depend on the facade.

Bookkeeping of what was prepared (so nothing is wrapped twice; optimizers follow the moved
parameters in `strategies.rebind`), the device check that catches an optimizer prepared apart
from its model, and the per-step ``backward`` chosen once from (accumulation steps, loss scaler).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "PreparedRegistry",
    "check_optimizer_device",
    "make_backward",
    "same_device",
]

BackwardFn = Callable[..., None]


class PreparedRegistry:
    """Remembers every object given to or returned by ``prepare`` to refuse preparing it twice."""

    def __init__(self) -> None:
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._ids: set[int] = set()

    def _add(self, obj: Any) -> None:
        try:
            self._seen.add(obj)
        except TypeError:  # not weak-referenceable: fall back to identity for this session
            self._ids.add(id(obj))

    def __contains__(self, obj: Any) -> bool:
        return id(obj) in self._ids or obj in self._seen

    def claim(self, obj: Any, what: str) -> None:
        """Record ``obj`` as being prepared now.

        Raises:
            RuntimeError: ``obj`` (or the object prepare returned for it) was prepared already.
        """
        if obj in self:
            raise RuntimeError(
                f"This {what} ({type(obj).__name__}) was already passed to "
                "Accelerator.prepare; preparing it twice would wrap it twice (double DDP "
                "all-reduce, double optimizer steps). Prepare each object once and keep using the "
                "object prepare returned."
            )
        self._add(obj)

    def record(self, obj: Any) -> None:
        """Record an object prepare returned, so passing it back is refused as well."""
        self._add(obj)


def same_device(tensor_device: torch.device, device: torch.device) -> bool:
    """Tell whether a tensor on ``tensor_device`` lives on ``device`` (index-agnostic if unset)."""
    if tensor_device.type != device.type:
        return False
    return device.index is None or tensor_device.index in (None, device.index)


def check_optimizer_device(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Refuse an optimizer whose parameters are not on ``device`` after the models moved.

    Raises:
        RuntimeError: a parameter sits on another device, i.e. the optimizer was prepared
            without (or before) the model owning it, so it would update stale copies.
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not same_device(param.device, device):
                raise RuntimeError(
                    f"The optimizer {type(optimizer).__name__} holds a parameter on "
                    f"{str(param.device)!r} but the Accelerator trains on {str(device)!r}: it was "
                    "prepared without its model. Pass the model to the same prepare() call "
                    "(or prepare it first): prepare(model, optimizer, ...)."
                )


def _plain(loss: torch.Tensor, **kwargs: Any) -> None:
    loss.backward(**kwargs)


def make_backward(
    num_steps: int, scale: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> BackwardFn:
    """Return the per-step backward: divide by ``num_steps`` only if > 1, scale only if asked.

    Chosen once (and again when the number of steps changes) so a plain fp32 step costs exactly
    ``loss.backward()``.
    """
    if num_steps == 1 and scale is None:
        return _plain
    if scale is None:

        def _averaged(loss: torch.Tensor, **kwargs: Any) -> None:
            (loss / num_steps).backward(**kwargs)

        return _averaged
    scaler = scale
    if num_steps == 1:

        def _scaled(loss: torch.Tensor, **kwargs: Any) -> None:
            scaler(loss).backward(**kwargs)

        return _scaled

    def _scaled_averaged(loss: torch.Tensor, **kwargs: Any) -> None:
        scaler(loss / num_steps).backward(**kwargs)

    return _scaled_averaged

"""The pieces of `Accelerator.prepare` that do not depend on the facade.

Bookkeeping of what was prepared (a prepared object passed again comes back unchanged; nothing
is wrapped twice; optimizers follow the moved parameters in `strategies.rebind`), the device
check that catches an optimizer prepared apart from its model, and the per-step ``backward``
chosen once from (accumulation steps, loss scaler).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import torch

from hasten.strategies.base import BackwardFn

__all__ = [
    "PreparedRegistry",
    "check_optimizer_device",
    "make_backward",
    "same_device",
]


class _IdentitySet:
    """Objects held weakly where possible, else by id (a set that never calls ``__eq__``)."""

    def __init__(self) -> None:
        self._refs: weakref.WeakSet[Any] = weakref.WeakSet()
        self._ids: set[int] = set()

    def add(self, obj: Any) -> None:
        try:
            self._refs.add(obj)
        except TypeError:  # not weak-referenceable (or unhashable): identity for this session
            self._ids.add(id(obj))

    def discard(self, obj: Any) -> None:
        self._ids.discard(id(obj))
        with contextlib.suppress(TypeError):
            self._refs.discard(obj)

    def __getstate__(self) -> list[Any]:
        # Pickled with the Accelerator (Accelerate's test_can_pickle_dataloader): the live
        # objects, held weakly again once read back. Bare ids mean nothing in another process.
        return list(self._refs)

    def __setstate__(self, objects: list[Any]) -> None:
        self.__init__()  # type: ignore[misc]
        for obj in objects:
            self.add(obj)

    def __contains__(self, obj: Any) -> bool:
        if id(obj) in self._ids:
            return True
        try:
            return obj in self._refs
        except TypeError:
            return False


class PreparedRegistry:
    """What ``prepare`` was given and what it returned.

    As in Accelerate, an object ``prepare`` returned (marked ``_is_accelerate_prepared``) comes
    back unchanged when passed again. An object ``prepare`` *replaced* by a wrapper (a model
    wrapped in DDP, a raw optimizer) is refused if passed again: wrapping it a second time would
    all-reduce or step twice. A model prepared with ``evaluation_mode=True`` may later be prepared
    for training (it then gets its training wrapper); that is remembered across `forget()`.
    """

    def __init__(self) -> None:
        self._given = _IdentitySet()
        self._returned = _IdentitySet()
        self._evaluation_only = _IdentitySet()

    def __contains__(self, obj: Any) -> bool:
        return obj in self._given or obj in self._returned

    def hands_back(self, obj: Any, training: bool = True) -> bool:
        """Whether ``prepare`` should return ``obj`` as it is: it is already prepared (for
        training, if ``training``)."""
        if training and obj in self._evaluation_only:
            return False
        return obj in self._returned or getattr(obj, "_is_accelerate_prepared", False) is True

    def claim(self, obj: Any, what: str) -> None:
        """Record ``obj`` as being prepared now.

        Raises:
            RuntimeError: ``obj`` was given to prepare before and replaced by a wrapper.
        """
        if obj in self._evaluation_only:  # prepared for evaluation, now for training
            self._evaluation_only.discard(obj)
            return
        if obj in self._given:
            raise RuntimeError(
                f"This {what} ({type(obj).__name__}) was already passed to "
                "Accelerator.prepare, which returned a wrapper for it; preparing it again would "
                "wrap it twice (double DDP all-reduce, double optimizer steps). Keep using the "
                "object prepare returned (passing that one again returns it unchanged)."
            )
        self._given.add(obj)

    def record(self, obj: Any, evaluation_only: bool = False) -> None:
        """Record an object prepare returned (passing it again hands it back)."""
        self._returned.add(obj)
        if evaluation_only:
            self._evaluation_only.add(obj)

    def forget(self) -> None:
        """Forget what was given and returned (`Accelerator.free_memory`); models prepared only
        for evaluation stay known, so preparing one for training still wraps it."""
        self._given = _IdentitySet()
        self._returned = _IdentitySet()


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

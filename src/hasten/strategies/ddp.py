"""Distributed data parallel: one model replica per process, gradients all-reduced in backward.

The wrapper is `strategies.parallelize`'s DDP step; this strategy gives it `DDPSettings` and
answers the per-step questions (``no_sync``, ``join``, syncing inside ``no_sync``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from hasten.strategies.base import Strategy

if TYPE_CHECKING:
    from hasten.strategies.call import PrepareCall
    from hasten.strategies.parallelize import ParallelPlan
    from hasten.strategies.settings import DDPSettings

__all__ = ["DDPStrategy", "DDPWrapSettings", "sync_in_backward"]

# DistributedDataParallelKwargs fields that configure the comm hook, not the DDP constructor.
_HOOK_FIELDS = frozenset({"comm_hook", "comm_wrapper", "comm_state_option"})


class DDPWrapSettings(Protocol):
    """What the strategy needs from `DistributedDataParallelKwargs` (config layer)."""

    def to_kwargs(self) -> dict[str, Any]:
        """Return the fields the user changed from their defaults."""
        ...

    def register_comm_hook(self, model: DistributedDataParallel) -> None:
        """Install the requested communication hook (fp16/bf16/PowerSGD...) on ``model``."""
        ...


@contextlib.contextmanager
def sync_in_backward(module: nn.Module) -> Iterator[None]:
    """Context in which the next backward of a `DistributedDataParallel` ``module`` all-reduces
    its gradients, even inside ``no_sync`` (any other module: nothing to do)."""
    if not isinstance(module, DistributedDataParallel):
        yield
        return
    saved = (module.require_backward_grad_sync, module.require_forward_param_sync)
    module.require_backward_grad_sync = True
    module.require_forward_param_sync = True
    # The reducer must expect this backward even if forward ran under no_sync.
    module.reducer.prepare_for_backward([])
    try:
        yield
    finally:
        module.require_backward_grad_sync, module.require_forward_param_sync = saved


class DDPStrategy(Strategy):
    """Wrap the model in `DistributedDataParallel` with the user's kwargs and comm hook.

    Args:
        device_ids: passed to DDP (``[local_index]`` on accelerators, None on CPU).
        ddp_kwargs: the user's `DistributedDataParallelKwargs`, or None for DDP's defaults.
    """

    name = "ddp"
    syncs_gradients = True
    joins_uneven_inputs = True

    def __init__(
        self, device_ids: list[int] | None = None, ddp_kwargs: DDPWrapSettings | None = None
    ) -> None:
        self.device_ids = device_ids
        self.ddp_kwargs = ddp_kwargs

    def wrap_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the `DistributedDataParallel` constructor."""
        kwargs: dict[str, Any] = {}
        if self.ddp_kwargs is not None:
            kwargs = {k: v for k, v in self.ddp_kwargs.to_kwargs().items() if k not in _HOOK_FIELDS}
        if self.device_ids is not None:
            kwargs.setdefault("device_ids", self.device_ids)
            kwargs.setdefault("output_device", self.device_ids[0])
        return kwargs

    def settings(self) -> DDPSettings:
        """The DDP step's settings: the constructor's kwargs and the user's comm hook."""
        from hasten.strategies.settings import DDPSettings

        hook = self.ddp_kwargs.register_comm_hook if self.ddp_kwargs is not None else None
        return DDPSettings(kwargs=self.wrap_kwargs(), comm_hook=hook)

    @override
    def parallel_plan(self, model: nn.Module, call: PrepareCall, index: int) -> ParallelPlan:
        """Placement, autocast, then the DDP wrapper, then compilation (`parallelize`)."""
        plan = super().parallel_plan(model, call, index)
        return dataclasses.replace(plan, ddp=self.settings())

    @override
    def no_sync(self, module: nn.Module) -> AbstractContextManager[None]:
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        return contextlib.nullcontext()

    @override
    def join(self, joinables: list[Any]) -> AbstractContextManager[Any]:
        # Join shadows the collectives of processes that ran out of batches.
        return Join(joinables)

    @override
    def trigger_sync_in_backward(self, module: nn.Module) -> AbstractContextManager[None]:
        return sync_in_backward(module)

    @override
    def __repr__(self) -> str:
        return f"DDPStrategy(device_ids={self.device_ids!r})"

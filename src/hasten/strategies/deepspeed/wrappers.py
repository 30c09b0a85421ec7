"""What `prepare` returns under DeepSpeed: the engine does backward, step and zero_grad.

`DeepSpeedEngineWrapper.backward` runs the engine's backward (which divides by the accumulation
steps and applies DeepSpeed's own fp16 loss scaling) and its step (which updates, clips, zeroes
gradients and steps the scheduler on accumulation boundaries). The optimizer and scheduler
wrappers therefore do nothing on `step` / `zero_grad`: the engine already did it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from hasten.optimizer import AcceleratedOptimizer
from hasten.scheduler import AcceleratedScheduler

__all__ = ["DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper"]


class DeepSpeedEngineWrapper:
    """Drive a DeepSpeed engine from `Accelerator.backward`.

    Args:
        engine: the `deepspeed.DeepSpeedEngine` returned by `deepspeed.initialize`.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: Any, sync_gradients: bool = True, **kwargs: Any) -> None:
        """Backward through the engine, then its step (an update only on a boundary).

        ``sync_gradients`` (the Accelerator's accumulation boundary) tells DeepSpeed whether
        this micro-batch ends the accumulation, so both agree, including at the end of a
        data loader whose length is not a multiple of the accumulation steps.
        """
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        self.engine.step()

    def get_global_grad_norm(self) -> Any:
        """The global gradient norm DeepSpeed computed at its last update (None before one)."""
        return self.engine.get_global_grad_norm()


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The engine's optimizer; `step` and `zero_grad` are done by the engine in backward.

    Args:
        optimizer: the optimizer `deepspeed.initialize` returned (ZeRO or a wrapped client one).
    """

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, device_placement=False, scaler=None)

    @override
    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Nothing: the engine zeroes gradients after each update."""

    @override
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        """Nothing: the engine stepped in `Accelerator.backward`."""

    @property
    @override
    def step_was_skipped(self) -> bool:
        """Whether DeepSpeed's fp16 loss scaler skipped the last update (overflow)."""
        return bool(getattr(self.optimizer, "overflow", False))


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The scheduler handed to the engine, which steps it with each update.

    Args:
        scheduler: the learning-rate scheduler given to `deepspeed.initialize`.
        optimizers: the optimizer(s) it schedules.
    """

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers)

    @override
    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine steps the scheduler on each update."""

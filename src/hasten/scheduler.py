"""`AcceleratedScheduler`: step the learning-rate schedule only when the optimizer really stepped.

Steps skipped by the fp16 grad scaler and accumulation micro-steps leave the schedule where it
is. Without ``split_batches`` each step consumed ``num_processes`` batches' worth of data, so
the schedule advances ``num_processes`` times, which keeps a schedule written for one process
on the same data budget. Those counts are fixed in the constructor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hasten.state import GradientState, PartialState

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wrap a learning-rate scheduler so it follows the optimizer steps that really happened.

    Args:
        scheduler: the scheduler to wrap.
        optimizers: the optimizer, or optimizers, it schedules.
        step_with_optimizer: tie the schedule to optimizer steps; when False, `step` always
            steps the scheduler.
        split_batches: batches are split across processes (one scheduler step per optimizer
            step) rather than multiplied by them (``num_processes`` scheduler steps).
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: Any,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = (
            list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        )
        self.gradient_state = GradientState()
        self._num_processes = PartialState().num_processes
        # Only wrapped optimizers can skip a step; plain ones never report one.
        self._skippable: Sequence[Any] = [
            opt for opt in self.optimizers if hasattr(opt, "step_was_skipped")
        ]
        self._step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches

    @property
    def split_batches(self) -> bool:
        """Whether one optimizer step counts as one scheduler step."""
        return self._split_batches

    @split_batches.setter
    def split_batches(self, split_batches: bool) -> None:
        self._split_batches = split_batches
        self._steps_per_call = 1 if split_batches else self._num_processes
        # OneCycleLR-like schedules raise past their end; the extra per-process steps must not
        # push them there when the last batch was short.
        self._bounded = not split_batches and hasattr(self.scheduler, "total_steps")

    @property
    def step_with_optimizer(self) -> bool:
        """Whether the schedule follows the optimizer steps."""
        return self._step_with_optimizer

    @step_with_optimizer.setter
    def step_with_optimizer(self, value: bool) -> None:
        self._step_with_optimizer = value

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule if (and as many times as) the optimizer stepped."""
        if not self._step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        gradient_state = self.gradient_state
        if not gradient_state.sync_gradients:
            if gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        for optimizer in self._skippable:
            if optimizer.step_was_skipped:
                return
        scheduler = self.scheduler
        if self._bounded:
            # Bounded by real steps (last_epoch), not `_step_count`, which adjust_scheduler also
            # advances on accumulation micro-steps and would end the schedule early.
            for _ in range(self._steps_per_call):
                if scheduler.last_epoch < scheduler.total_steps:
                    scheduler.step(*args, **kwargs)
            return
        for _ in range(self._steps_per_call):
            scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """Return the learning rates computed by the last step."""
        return self.scheduler.get_last_lr()

    def get_lr(self) -> Any:
        """Return the wrapped scheduler's ``get_lr()``."""
        return self.scheduler.get_lr()

    def print_lr(self, *args: object, **kwargs: object) -> Any:
        """Call the wrapped scheduler's ``print_lr``."""
        return self.scheduler.print_lr(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """Return the wrapped scheduler's state dict."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict into the wrapped scheduler."""
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        # Anything else (last_epoch, base_lrs, ...) reads through to the wrapped scheduler.
        if name == "scheduler" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __getstate__(self) -> dict[str, Any]:
        # The shared GradientState belongs to the process, not to the pickle.
        return {k: v for k, v in self.__dict__.items() if k != "gradient_state"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.gradient_state = GradientState()

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"

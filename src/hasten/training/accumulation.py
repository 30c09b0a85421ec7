"""Gradient accumulation: count micro-steps, decide when to sync, skip DDP communication otherwise.

Everything that does not change between steps (which strategy, whether it communicates, which
no-sync contexts exist) is fixed when the `GradientAccumulator` is built; the per-step work is
one counter update and, only for communicating strategies, entering the models' no-sync contexts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol

from torch import nn

__all__ = ["AccumulationState", "GradientAccumulator", "NoSyncProvider"]


class AccumulationState(Protocol):
    """The parts of `GradientState` the accumulator reads and writes."""

    @property
    def num_steps(self) -> int: ...

    @property
    def sync_with_dataloader(self) -> bool: ...

    @property
    def end_of_dataloader(self) -> bool: ...

    @property
    def plugin_kwargs(self) -> dict[str, Any]: ...

    def _set_sync_gradients(self, sync_gradients: bool) -> None: ...


class NoSyncProvider(Protocol):
    """The strategy method that opens a model's no-communication context."""

    syncs_gradients: bool

    def no_sync(self, module: nn.Module) -> AbstractContextManager[None]: ...


class _Accumulate:
    """Context returned by `GradientAccumulator.accumulate` (a class: cheaper than a generator)."""

    __slots__ = ("_accumulator", "_models", "_stack")

    def __init__(self, accumulator: GradientAccumulator, models: Sequence[nn.Module]) -> None:
        self._accumulator = accumulator
        self._models = models
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> None:
        acc = self._accumulator
        sync = acc.advance()
        if sync or not self._models or not acc.communicates:
            return
        if acc.sync_each_batch:
            return
        stack = contextlib.ExitStack()
        for model in self._models:
            stack.enter_context(acc.strategy.no_sync(model))
        self._stack = stack

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is not None:
            return stack.__exit__(exc_type, exc, tb)
        return None


class GradientAccumulator:
    """Tracks micro-steps and sets `GradientState.sync_gradients` at each `accumulate` entry.

    Args:
        gradient_state: the shared `GradientState` (num_steps, end of dataloader, sync flag).
        strategy: decides whether backward communicates and provides ``no_sync``.
    """

    def __init__(self, gradient_state: AccumulationState, strategy: NoSyncProvider) -> None:
        self.gradient_state = gradient_state
        self.strategy = strategy
        self.step = 0
        self.communicates = bool(strategy.syncs_gradients)
        self.sync_each_batch = bool(gradient_state.plugin_kwargs.get("sync_each_batch", False))

    def advance(self) -> bool:
        """Count one micro-step and publish whether this one must synchronise gradients."""
        state = self.gradient_state
        if state.sync_with_dataloader and state.end_of_dataloader:
            # The last batch always syncs, and the next epoch starts a fresh cycle.
            self.step = 0
            sync = True
        else:
            self.step += 1
            sync = self.step % state.num_steps == 0
        state._set_sync_gradients(sync)
        return sync

    def accumulate(self, models: Sequence[nn.Module]) -> AbstractContextManager[None]:
        """Context for one micro-step over ``models`` (no DDP all-reduce unless it syncs)."""
        return _Accumulate(self, models)

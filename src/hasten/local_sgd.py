"""Local SGD: each process takes optimizer steps on its own, parameters are averaged every
``local_sgd_steps`` steps (and on exit), so gradients are never synchronised in between.

Used as ``with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:`` around the
training loop, calling ``local_sgd.step()`` after each ``optimizer.step()``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from hasten.strategies import DDPStrategy
from hasten.strategies.single import SingleDeviceStrategy

if TYPE_CHECKING:
    from hasten.accelerator import Accelerator

__all__ = ["LocalSGD"]


class LocalSGD:
    """Average ``model``'s parameters across processes every ``local_sgd_steps`` calls to `step`.

    Args:
        accelerator: the run's `Accelerator` (single process or DDP).
        model: the prepared model.
        local_sgd_steps: optimizer steps between two averagings (a positive int).
        enabled: False turns every method into a no-op; also off in single-process runs.

    Raises:
        ValueError: ``local_sgd_steps`` is not a positive int, or the strategy shards the model
            (FSDP, DeepSpeed, Megatron-LM...), so there are no full replicas to average.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
    ) -> None:
        strategy = accelerator.strategy
        if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):
            raise ValueError(
                f"LocalSGD averages full model replicas, which the {strategy.name!r} strategy "
                "does not keep; it supports single-process and DDP runs on CPUs and GPUs "
                "(no FSDP, DeepSpeed or Megatron-LM). Drop LocalSGD or train with DDP."
            )
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int):
            raise ValueError(f"local_sgd_steps must be a positive int, got {local_sgd_steps!r}")
        if local_sgd_steps < 1:
            raise ValueError(
                f"local_sgd_steps must be >= 1 (steps between averagings), got {local_sgd_steps}"
            )
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = bool(enabled) and isinstance(strategy, DDPStrategy)
        self.num_steps = 0
        # the tensors to average, fixed once (not walked again at every sync)
        self._params = list(model.parameters()) if self.enabled else []
        self._no_sync: AbstractContextManager[None] | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.enabled or self._no_sync is None:
            return
        no_sync, self._no_sync = self._no_sync, None
        try:
            if exc_type is None:  # after an error the peers may not reach the collective
                self._sync_and_avg_model_params()
        finally:
            no_sync.__exit__(exc_type, exc, tb)

    def step(self) -> None:
        """Count one optimizer step; average the parameters when ``local_sgd_steps`` is reached."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        """Replace every parameter by its mean over processes (one collective per dtype)."""
        averaged = self.accelerator.reduce([p.detach() for p in self._params], reduction="mean")
        with torch.no_grad():
            for param, mean in zip(self._params, averaged):
                param.copy_(mean)

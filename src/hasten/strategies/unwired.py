"""Stand-in for an engine hasten does not run (XLA), or a plugin this run cannot honour."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from torch import nn
from typing_extensions import override

from hasten.strategies.base import Strategy

if TYPE_CHECKING:
    from hasten.strategies.call import PrepareCall
    from hasten.strategies.parallelize import ParallelPlan

__all__ = ["UnwiredStrategy"]


class UnwiredStrategy(Strategy):
    """Stands in for an engine hasten does not run (XLA), or a DeepSpeed / Megatron-LM plugin a
    run cannot honour (a Megatron-LM label without its plugin, a plugin without its engine).

    The Accelerator can be built (the plugin is validated and stored), but preparing anything
    raises `NotImplementedError` that names the engine and what works today.
    """

    name = "unwired"

    def __init__(self, engine: str) -> None:
        self.engine = engine

    def _refuse(self) -> NoReturn:
        raise NotImplementedError(
            f"The {self.engine} engine is not wired into hasten yet: its plugin was accepted and "
            f"validated, but models cannot be prepared with it. Remove the {self.engine} "
            "plugin/config (and ACCELERATE_USE_* variable) to train with DDP or a single process."
        )

    @override
    def check_usable(self) -> None:
        self._refuse()

    @override
    def parallel_plan(self, model: nn.Module, call: PrepareCall, index: int) -> ParallelPlan:
        self._refuse()

    @override
    def __repr__(self) -> str:
        return f"UnwiredStrategy(engine={self.engine!r})"

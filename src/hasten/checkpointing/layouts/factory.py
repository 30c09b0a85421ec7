"""The layout a strategy declares, as an object: the one place layouts are made.

A strategy chooses its layout by calling one method of the `LayoutFactory` it is given
(`hasten.strategies.checkpoints`); `checkpoint_layout` gives it this module's factory. No
string names a layout, and each layout gets the strategy typed as what it reads state through.
"""

from __future__ import annotations

from typing import Any

from hasten.checkpointing.layouts.base import CheckpointLayout
from hasten.checkpointing.layouts.dcp_shards import ShardedLayout
from hasten.checkpointing.layouts.engine import EngineLayout
from hasten.checkpointing.layouts.gathered import GatheredLayout
from hasten.checkpointing.layouts.replicated import ReplicatedLayout
from hasten.strategies import Strategy
from hasten.strategies.checkpoints import EngineCheckpoint, ShardedStateDicts, StateDicts

__all__ = ["checkpoint_layout", "default_layout"]


class _Layouts:
    """The `LayoutFactory` of `hasten.checkpointing.layouts`: one constructor per layout."""

    def replicated(self, strategy: StateDicts) -> CheckpointLayout[Any]:
        return ReplicatedLayout(strategy)

    def gathered(self, strategy: ShardedStateDicts) -> CheckpointLayout[Any]:
        return GatheredLayout(strategy)

    def sharded(self, strategy: ShardedStateDicts) -> CheckpointLayout[Any]:
        return ShardedLayout(strategy)

    def engine(self, strategy: EngineCheckpoint) -> CheckpointLayout[Any]:
        return EngineLayout(strategy)


_FACTORY = _Layouts()


def checkpoint_layout(strategy: Strategy) -> CheckpointLayout[Any]:
    """The layout ``strategy`` declares (`Strategy.checkpoint_layout`)."""
    return strategy.checkpoint_layout(_FACTORY)


def default_layout() -> CheckpointLayout[Any]:
    """The replicated layout over the base strategy: what Accelerate's positional
    ``save_accelerator_state`` / ``load_accelerator_state`` write and read."""
    return ReplicatedLayout(Strategy())

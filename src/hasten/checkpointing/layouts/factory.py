"""The layout a strategy declares, as an object: the one place layouts are made.

A strategy chooses its layout by calling one method of the `LayoutFactory` it is given
(`hasten.strategies.checkpoints`); `checkpoint_layout` gives it this module's factory. No
string names a layout, and each layout gets the strategy typed as what it reads state through.
"""

from __future__ import annotations

from hasten.checkpointing.layouts.base import CheckpointContents, CheckpointLayout
from hasten.checkpointing.layouts.engine import EngineLayout
from hasten.checkpointing.layouts.replicated import GatheredLayout, ReplicatedLayout
from hasten.checkpointing.layouts.sharded import ShardedLayout
from hasten.strategies import Strategy
from hasten.strategies.checkpoints import EngineCheckpoint, ShardedStateDicts, StateDicts

__all__ = ["checkpoint_layout", "layout_of"]


class _Layouts:
    """The `LayoutFactory` of `hasten.checkpointing.layouts`: one constructor per layout."""

    def replicated(self, strategy: StateDicts) -> CheckpointLayout:
        return ReplicatedLayout(strategy)

    def gathered(self, strategy: ShardedStateDicts) -> CheckpointLayout:
        return GatheredLayout(strategy)

    def sharded(self, strategy: ShardedStateDicts) -> CheckpointLayout:
        return ShardedLayout(strategy)

    def engine(self, strategy: EngineCheckpoint) -> CheckpointLayout:
        return EngineLayout(strategy)


_FACTORY = _Layouts()


def checkpoint_layout(strategy: Strategy) -> CheckpointLayout:
    """The layout ``strategy`` declares (`Strategy.checkpoint_layout`)."""
    return strategy.checkpoint_layout(_FACTORY)


def layout_of(contents: CheckpointContents) -> CheckpointLayout:
    """``contents``' layout; without one, the replicated layout over the base strategy (what
    Accelerate's positional ``save_accelerator_state`` / ``load_accelerator_state`` write)."""
    if contents.layout is not None:
        return contents.layout
    return ReplicatedLayout(Strategy())

"""Every process writes its shards of the models and optimizers through DCP, into one folder.

`ShardedLayout` is the layout of strategies that save sharded state dicts (FSDP's
SHARDED_STATE_DICT, FSDP2's default, tensor parallelism): each model and optimizer goes into
its own DCP folder inside the checkpoint's staging folder (`hasten.checkpointing.layouts.dcp_parts`),
with one DCP call for all of them, while the other files are written. It needs one folder every
process writes. What is on disk decides how each part is read back
(`hasten.checkpointing.layouts.read`): DCP parts resharded to this run, whole files through
the strategy.
"""

from __future__ import annotations

from collections.abc import Callable

from hasten.checkpointing.layouts.base import (
    CheckpointContents,
    CheckpointLayout,
    LayoutLoad,
    LayoutSave,
    PreparedObjects,
    unwrapped_contents,
)
from hasten.checkpointing.layouts.dcp_parts import StagedParts, make_part_folders, stage_sharded
from hasten.checkpointing.layouts.model_files import StrategyModels, warn_unsaved_gradients
from hasten.checkpointing.layouts.optimizer_files import StrategyOptimizers
from hasten.checkpointing.layouts.read import Restore, read_from_disk
from hasten.checkpointing.storage.agreement import background_group
from hasten.checkpointing.storage.writer import LayoutWritten
from hasten.state import PartialState
from hasten.strategies.checkpoints import ShardedStateDicts

__all__ = ["ShardedLayout"]


class ShardedLayout(CheckpointLayout[StagedParts]):
    """Shards from every process through DCP (see the module).

    Args:
        strategy: what gives each model's and optimizer's shards and loads them back.
    """

    needs_one_folder = "A sharded checkpoint"

    def __init__(self, strategy: ShardedStateDicts) -> None:
        self.strategy = strategy

    def contents(self, prepared: PreparedObjects, *, for_save: bool) -> CheckpointContents:
        """The user's modules (unwrapped): the shards are taken when the save is planned."""
        return unwrapped_contents(self.strategy.unwrap, prepared)

    def plan(self, save: LayoutSave) -> StagedParts:
        """Take this process's shards (copied to host memory for an asynchronous save)."""
        contents = save.contents
        warn_unsaved_gradients(contents.models, stacklevel=5)
        return stage_sharded(
            self.strategy, contents.modules, contents.optimizers, save.copy, save.deferred
        )

    def write(
        self, save: LayoutSave, staged: StagedParts
    ) -> LayoutWritten | Callable[[], LayoutWritten]:
        """Every process writes its shards (the other files meanwhile); asynchronously, on the
        writer thread over a process group of its own. A failure propagates on every process
        (DCP fails on all of them); the save transaction cleans up and agrees."""
        plan = save.plan
        if PartialState().is_main_process:
            make_part_folders(plan.staging, staged.names)
        if save.buffers is not None:  # DCP runs on the writer thread, over a group of its own
            group = background_group(save.buffers)
            deferred = save.deferred
            return lambda: staged.write(plan, deferred, group)
        return staged.write(plan, None, None)

    def load(self, load: LayoutLoad) -> Callable[[], None]:
        """Start reading what is on disk (one DCP load for the parts, in the returned step)."""
        strategy = self.strategy
        restore = Restore(
            StrategyModels(strategy), StrategyOptimizers(strategy), strategy, strategy
        )
        return read_from_disk(load, restore)

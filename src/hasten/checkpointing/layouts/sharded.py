"""Every process writes its shards of the models and optimizers through DCP, into one folder.

`ShardedLayout` is the layout of strategies that save sharded state dicts (FSDP's
SHARDED_STATE_DICT, FSDP2's default, tensor parallelism): each model and optimizer goes into
its own DCP folder inside the checkpoint's staging folder (`hasten.checkpointing.layouts.parts`),
with one DCP call for all of them, while the other files are written. It needs one folder every
process writes, and reads back whatever is on disk, as the gathered layout does.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

from hasten.checkpointing.layouts.base import CheckpointContents, LayoutSave
from hasten.checkpointing.layouts.parts import StagedParts, make_part_folders, stage_sharded
from hasten.checkpointing.layouts.replicated import GatheredLayout, warn_unsaved_gradients
from hasten.checkpointing.storage.agreement import agree_on_outcome, background_group
from hasten.state import PartialState

__all__ = ["ShardedLayout"]


class ShardedLayout(GatheredLayout):
    """Shards from every process through DCP (see the module); loads as `GatheredLayout`."""

    needs_one_folder = "A sharded checkpoint"

    def _take_states(self, contents: CheckpointContents) -> None:
        """Nothing before the pre-hooks: the shards are taken when the save is planned."""

    def plan(self, save: LayoutSave) -> None:
        """Take this process's shards (copied to host memory for an asynchronous save)."""
        contents = save.contents
        warn_unsaved_gradients(contents.models, stacklevel=5)
        save.staged = stage_sharded(
            self.sharding,
            contents.prepared_models or contents.models,
            contents.optimizers,
            save.copy,
            save.deferred,
        )

    def write(self, save: LayoutSave) -> Callable[[], None] | None:
        """Every process writes its shards (the other files meanwhile); asynchronously, on the
        writer thread over a process group of its own."""
        staged: StagedParts = save.staged
        plan = save.plan
        if PartialState().is_main_process:
            make_part_folders(plan.staging, staged.names)
        if save.buffers is not None:  # DCP runs on the writer thread, over a group of its own
            group = background_group(save.buffers)
            deferred = save.deferred
            return lambda: staged.write(plan, deferred, group)
        try:
            staged.write(plan, None, None)
        except Exception as exc:  # noqa: BLE001 - nothing is published; every process raises
            shutil.rmtree(plan.staging, ignore_errors=True)
            agree_on_outcome(exc)
            raise
        return None

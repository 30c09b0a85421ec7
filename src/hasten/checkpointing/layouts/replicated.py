"""One copy of every model and optimizer, written by the main process, read back in place.

`ReplicatedLayout` is the layout of strategies whose processes each hold the whole model
(one process, DDP): the main process writes ``model.safetensors`` and ``optimizer.bin`` (each
process also its accumulated, not yet stepped, gradients), and a load reads them straight
into the live parameters and optimizer state tensors (see `hasten.checkpointing.storage.scatter`).
What is on disk decides how each part is read (`hasten.checkpointing.layouts.read`).
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
from hasten.checkpointing.layouts.model_files import InPlaceModels, gradient_jobs, model_jobs
from hasten.checkpointing.layouts.optimizer_files import InPlaceOptimizers, optimizer_jobs
from hasten.checkpointing.layouts.read import Restore, read_from_disk
from hasten.strategies.checkpoints import StateDicts

__all__ = ["ReplicatedLayout"]


class ReplicatedLayout(CheckpointLayout[None]):
    """Every process holds the whole model: one copy, from the main process, loaded in place.

    Args:
        strategy: what the models' state dicts are read through (an unwrapped module's own for
            a plain one; a sharded part on disk through its sharded state dicts).
    """

    def __init__(self, strategy: StateDicts) -> None:
        self.strategy = strategy

    def contents(self, prepared: PreparedObjects, *, for_save: bool) -> CheckpointContents:
        """The user's modules (unwrapped) and, for a save, their state dicts."""
        models = [self.strategy.unwrap(m) for m in prepared.models]
        states = [m.state_dict() for m in models] if for_save else None
        return unwrapped_contents(self.strategy.unwrap, prepared, states)

    def plan(self, save: LayoutSave) -> None:
        """The main process writes the models and optimizers; each process its own gradients."""
        plan = save.plan
        if plan.is_writer:
            states = [save.copy(s) for s in save.contents.model_states]
            jobs = model_jobs(states, save.safe_serialization) + optimizer_jobs(save)
            plan.jobs += jobs
            plan.shared_names += [job.name for job in jobs]
        plan.jobs += gradient_jobs(save.contents.models, plan.rank, save.copy)

    def load(self, load: LayoutLoad) -> Callable[[], None]:
        """Start reading what is on disk; whole files go into the live tensors."""
        restore = Restore(InPlaceModels(), InPlaceOptimizers(self.strategy), self.strategy)
        return read_from_disk(load, restore)

"""Parameters split across processes, saved as one full copy gathered to the main process.

`GatheredLayout` is the layout of strategies that save full state dicts (FSDP's
FULL_STATE_DICT): the state is gathered to the main process first, which writes the same files
as the replicated layout (`model_files`, `optimizer_files`); a load reads them into new memory
and hands them to the strategy, which shards them again. Accumulated gradients are not saved
(a warning says so). What is on disk decides how each part is read
(`hasten.checkpointing.layouts.read`).
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
from hasten.checkpointing.layouts.dcp_parts import optimizer_owner
from hasten.checkpointing.layouts.model_files import (
    StrategyModels,
    model_jobs,
    warn_unsaved_gradients,
)
from hasten.checkpointing.layouts.optimizer_files import StrategyOptimizers, optimizer_jobs
from hasten.checkpointing.layouts.read import Restore, read_from_disk
from hasten.strategies.checkpoints import ShardedStateDicts

__all__ = ["GatheredLayout"]


class GatheredLayout(CheckpointLayout[None]):
    """Full state dicts gathered to the main process; loaded through the strategy (see module).

    Args:
        strategy: what gathers the full state dicts and shards them again on load.
    """

    def __init__(self, strategy: ShardedStateDicts) -> None:
        self.strategy = strategy

    def contents(self, prepared: PreparedObjects, *, for_save: bool) -> CheckpointContents:
        """The user's modules (unwrapped); for a save, the full states gathered to the main
        process (collectives), before the user's pre-hooks see them."""
        if not for_save:
            return unwrapped_contents(self.strategy.unwrap, prepared)
        models = list(prepared.models)
        states = [self.strategy.model_state_dict(m, full=True) for m in models]
        optimizers = [
            self.strategy.optimizer_state_dict(optimizer_owner(o, models), o, full=True)
            for o in prepared.optimizers
        ]
        return unwrapped_contents(self.strategy.unwrap, prepared, states, optimizers)

    def plan(self, save: LayoutSave) -> None:
        """The main process writes the gathered models and optimizers."""
        plan = save.plan
        if plan.is_writer:
            states = [save.copy(s) for s in save.contents.model_states]
            jobs = model_jobs(states, save.safe_serialization) + optimizer_jobs(save)
            plan.jobs += jobs
            plan.shared_names += [job.name for job in jobs]
        warn_unsaved_gradients(save.contents.models, stacklevel=5)

    def load(self, load: LayoutLoad) -> Callable[[], None]:
        """Start reading what is on disk; whole files go through the strategy."""
        strategy = self.strategy
        restore = Restore(
            StrategyModels(strategy), StrategyOptimizers(strategy), strategy, strategy
        )
        return read_from_disk(load, restore)

"""Optimizer files shared by the layouts that write whole optimizer states.

`optimizer_jobs` writes one ``optimizer.bin`` per optimizer (a CPU state of an asynchronous
save copied on the writer thread). A load puts a state back through `InPlaceOptimizers` (into
the live state tensors; a state keyed by parameter name renumbered first) or
`StrategyOptimizers` (a full state the sharding strategy shards again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from hasten.checkpointing.layouts.base import on_cpu
from hasten.checkpointing.layouts.dcp_parts import optimizer_owner
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.reader import CheckpointReader, PendingRead
from hasten.checkpointing.storage.writer import FileJob, pickle_job
from hasten.optimizer import unwrap_optimizer
from hasten.strategies.checkpoints import ShardedStateDicts, StateDicts
from hasten.strategies.sharded import by_position, keyed_by_name

if TYPE_CHECKING:
    import torch

    from hasten.checkpointing.layouts.base import LayoutSave

__all__ = ["InPlaceOptimizers", "StrategyOptimizers", "optimizer_jobs"]


def optimizer_jobs(save: LayoutSave) -> list[FileJob]:
    """One file per optimizer; a CPU state of an asynchronous save is copied on the writer thread."""
    jobs = []
    given = save.contents.optimizer_states
    for i, optimizer in enumerate(save.contents.optimizers):
        name = paths.optimizer_file(i)
        state = given[i] if given is not None else optimizer.state_dict()
        deferred = save.deferred
        if deferred is not None and on_cpu(state) and set(state) == {"state", "param_groups"}:
            # only the per-parameter state waits for the writer thread: a tensor learning rate
            # in param_groups may be changed in place by a scheduler before the next step
            groups = save.copy(state["param_groups"])
            jobs.append(
                deferred.job(name, {**state, "param_groups": groups}, unwrap_optimizer(optimizer))
            )
        else:
            jobs.append(pickle_job(name, save.copy(state)))
    return jobs


def _current(optimizer: torch.optim.Optimizer) -> Any:
    """The optimizer's live state dict to read into, or None if it cannot give one cheaply."""
    try:
        return optimizer.state_dict()
    except Exception:  # noqa: BLE001 - e.g. ZeroRedundancyOptimizer before consolidation
        return None


class InPlaceOptimizers:
    """Optimizer states read into the live state tensors (every process holds them whole)."""

    def __init__(self, strategy: StateDicts) -> None:
        self.strategy = strategy

    def start(
        self,
        files: CheckpointReader,
        index: int,
        optimizer: torch.optim.Optimizer,
        where: str | torch.device,
    ) -> PendingRead:
        """Start reading optimizer ``index`` into its live state tensors."""
        # its state tensors are replaced by the loaded ones anyway, so large files are read
        # into them in place (see hasten.checkpointing.storage.scatter)
        return files.start_unpickle(paths.optimizer_file(index), where, like=_current(optimizer))

    def apply(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any], prepared: Sequence[nn.Module]
    ) -> None:
        """Load one optimizer's state; one keyed by parameter name (a sharding engine's full
        state) is numbered in this optimizer's order first (see `by_position`)."""
        if keyed_by_name(state):
            owner = optimizer_owner(optimizer, prepared)
            module = self.strategy.unwrap(owner, keep_torch_compile=False)
            state = by_position(module, unwrap_optimizer(optimizer), state)
        optimizer.load_state_dict(state)


class StrategyOptimizers:
    """Full optimizer states read into new memory and loaded through the sharding strategy."""

    def __init__(self, strategy: ShardedStateDicts) -> None:
        self.strategy = strategy

    def start(
        self,
        files: CheckpointReader,
        index: int,
        optimizer: torch.optim.Optimizer,
        where: str | torch.device,
    ) -> PendingRead:
        """Start reading optimizer ``index`` into new memory."""
        return files.start_unpickle(paths.optimizer_file(index), where)

    def apply(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any], prepared: Sequence[nn.Module]
    ) -> None:
        """Load the full state through the strategy (which shards it)."""
        owner = optimizer_owner(optimizer, prepared)
        self.strategy.load_optimizer_state_dict(owner, optimizer, state, full=True)

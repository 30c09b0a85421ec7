"""Project layout, data-loader behaviour and gradient accumulation: what the user asked for."""

from __future__ import annotations

import dataclasses
from typing import Any

from hasten.config.handler import KwargsHandler
from hasten.core.coerce import whole_number

__all__ = ["DataLoaderConfiguration", "GradientAccumulationPlugin", "ProjectConfiguration"]


@dataclasses.dataclass
class ProjectConfiguration:
    """Where a project stores checkpoints and logs, and how checkpoints are named and pruned.

    Args:
        project_dir: directory for data and checkpoints.
        logging_dir: directory for tracker logs; defaults to `project_dir`.
        automatic_checkpoint_naming: name saved states `checkpoints/checkpoint_<iteration>`.
        total_limit: keep at most this many saved states (oldest are deleted).
        iteration: number of the next automatically named checkpoint.
        save_on_each_node: in multi-node runs, save on every node instead of the main one only.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.total_limit is not None:
            if whole_number(self.total_limit) is None:
                raise TypeError(
                    f"ProjectConfiguration(total_limit={self.total_limit!r}) must be an int or None"
                )
            self.total_limit = whole_number(self.total_limit)
        if self.total_limit is not None and self.total_limit <= 0:
            raise ValueError(
                f"ProjectConfiguration(total_limit={self.total_limit!r}) must be >= 1 (the number "
                "of saved states to keep), or None to keep them all"
            )
        if whole_number(self.iteration) is None:
            raise TypeError(f"ProjectConfiguration(iteration={self.iteration!r}) must be an int")
        self.iteration = whole_number(self.iteration)  # type: ignore[assignment]
        if self.iteration < 0:
            raise ValueError(
                f"ProjectConfiguration(iteration={self.iteration!r}) must be >= 0 (the number of "
                "the next automatically named checkpoint)"
            )
        self.set_directories(self.project_dir)

    def set_directories(self, project_dir: str | None = None) -> None:
        """Set `project_dir`, and `logging_dir` too when it has not been chosen yet."""
        self.project_dir = None if project_dir is None else str(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How `prepare` shards, dispatches and seeds data loaders.

    Args:
        split_batches: split each batch across processes (the batch size must divide by the
            number of processes) instead of giving every process a full batch.
        dispatch_batches: iterate only on the main process and send slices to the others;
            None means True for iterable datasets and False otherwise.
        even_batches: repeat samples from the start so every process gets the same number of
            batches.
        use_seedable_sampler: use a fully seedable random sampler for reproducible shuffling.
        data_seed: seed of that sampler's generator (None = torch's current default seed).
        non_blocking: copy batches to the device with non_blocking=True (use with pin_memory).
        use_stateful_dataloader: back prepared loaders by torchdata's StatefulDataLoader.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        if self.data_seed is not None and whole_number(self.data_seed) is None:
            raise TypeError(
                f"DataLoaderConfiguration(data_seed={self.data_seed!r}) must be an int or None"
            )
        if self.data_seed is not None:
            self.data_seed = whole_number(self.data_seed)


@dataclasses.dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradients are accumulated over several batches before each optimizer step.

    Pass it to `Accelerator(gradient_accumulation_plugin=...)` instead of
    `gradient_accumulation_steps` (not both).

    Args:
        num_steps: batches whose gradients are accumulated per step (None means 1).
        adjust_scheduler: scale scheduler steps by `num_steps`.
        sync_with_dataloader: force a synchronising step at the end of the data loader.
        sync_each_batch: synchronise gradients on every batch (less memory, slower).

    Example:
        >>> GradientAccumulationPlugin(num_steps=2).to_kwargs()
        {'num_steps': 2}
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        steps: Any = self.num_steps
        if steps is None:
            return
        if whole_number(steps) is None:
            raise TypeError(
                f"GradientAccumulationPlugin(num_steps={steps!r}) must be an int, e.g. num_steps=4"
            )
        steps = self.num_steps = whole_number(steps)  # np.int64(2) or 2.0 -> 2, as a plain int
        if steps < 1:
            raise ValueError(
                f"GradientAccumulationPlugin(num_steps={steps!r}) must be >= 1 (1 means no "
                "accumulation)"
            )

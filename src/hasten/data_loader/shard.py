"""`DataLoaderShard`: iterate this process's shard, move batches to the device, flag the last one.

The loader reads one batch ahead so that, when it hands out the last batch, it already knows
it is the last (`end_of_dataloader`): gradient accumulation syncs on it and gather_for_metrics
trims the samples that even_batches duplicated. Reading ahead costs nothing extra -- every
batch is fetched exactly once -- and the per-batch path is a fetch, an optional device move
and a counter.
"""

from __future__ import annotations

from typing import Any

import torch

from hasten.data_loader.base import ResumableDataLoader
from hasten.ops.random import synchronize_rng_states

__all__ = ["DataLoaderShard"]


class DataLoaderShard(ResumableDataLoader):
    """A `DataLoader` over one process's shard that puts batches on ``device``.

    Args:
        dataset: the dataset (already sharded by the batch sampler or `IterableDatasetShard`).
        device: where to put every batch; None leaves them where the collate function made them.
        rng_types: RNGs to synchronize from the main process at the start of each epoch
            (``"torch"``, ``"cuda"``, ``"xla"``, ``"generator"``, ...).
        synchronized_generator: the generator that ``"generator"`` refers to.
        skip_batches: batches to skip at the start of every iteration.
        use_stateful_dataloader: back this loader with torchdata's ``StatefulDataLoader``.
        torch_device_mesh: accepted for compatibility; sharding was decided by the caller.
        iteration: the epoch to start from.
        **kwargs: forwarded to `DataLoader` (``batch_sampler``, ``num_workers``, ...).

    Attributes:
        total_batch_size: samples in one step across all processes.
        total_dataset_length: length of the whole dataset.
    """

    def __init__(
        self,
        dataset: Any,
        device: torch.device | str | None = None,
        rng_types: list[Any] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset,
            use_stateful_dataloader=use_stateful_dataloader,
            skip_batches=skip_batches,
            iteration=iteration,
            **kwargs,
        )
        self.rng_types = rng_types
        self.synchronized_generator = synchronized_generator
        self.torch_device_mesh = torch_device_mesh
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.device = device

    @property
    def device(self) -> torch.device | str | None:
        """Where batches are put (None: left where they are)."""
        return self._device

    @device.setter
    def device(self, device: torch.device | str | None) -> None:
        self._device = device
        # Decided here, not per batch: the default collate builds CPU tensors, so a CPU
        # target needs no move at all.
        self._move_to = None if device is None or torch.device(device).type == "cpu" else device

    def _sync_rng(self) -> None:
        if self.rng_types is not None:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)

"""Shard an `IterableDataset` by batches: every process reads the stream, keeps its own slice.

An iterable dataset has no indices to deal out, so each process iterates the whole stream,
groups it into global batches and keeps the samples of its position. The last incomplete
global batch is dropped (``drop_last``) or completed with samples from the first one, so every
process yields the same number of samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

__all__ = ["IterableDatasetShard"]


class IterableDatasetShard(IterableDataset[Any]):
    """Yield one process's samples of an iterable dataset, a round multiple of the batch size.

    Without ``split_batches`` a global batch is ``batch_size * num_processes`` samples and
    process ``i`` keeps samples ``[i * batch_size, (i + 1) * batch_size)`` of each; with it a
    global batch is ``batch_size`` samples, cut into ``num_processes`` slices.

    Args:
        dataset: the iterable dataset to shard.
        batch_size: per-process batch size, or the global one under ``split_batches``.
        drop_last: drop the last incomplete global batch instead of completing it.
        num_processes: how many processes share the stream.
        process_index: which share this dataset yields.
        split_batches: cut each batch across processes instead of dealing whole batches.

    Raises:
        ValueError: ``split_batches`` with a batch size not divisible by ``num_processes``.
    """

    def __init__(
        self,
        dataset: IterableDataset[Any],
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size > 1 and batch_size % num_processes != 0:
            raise ValueError(
                "To use `IterableDatasetShard` in `split_batches` mode, the batch size "
                f"({batch_size!r}) needs to be a round multiple of the number of processes "
                f"({num_processes!r}): each batch is cut into {num_processes} equal parts. Use a "
                f"batch size divisible by {num_processes} or set split_batches=False."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch and pass it on to the wrapped dataset when it listens."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        global_batch = self.batch_size * self.num_processes
        length = len(self.dataset)  # type: ignore[arg-type]
        if self.drop_last:
            return (length // global_batch) * self.batch_size
        return math.ceil(length / global_batch) * self.batch_size

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            # A dataset that shuffles with its own generator and cannot be told the epoch:
            # reseed it so every process shuffles alike, and differently each epoch.
            generator.manual_seed(self.epoch)
        if self.split_batches:
            global_size = self.batch_size
            per_process = self.batch_size // self.num_processes
        else:
            global_size = self.batch_size * self.num_processes
            per_process = self.batch_size
        lo = self.process_index * per_process
        hi = lo + per_process
        first: list[Any] | None = None
        current: list[Any] = []
        for sample in self.dataset:
            current.append(sample)
            if len(current) == global_size:
                yield from current[lo:hi]
                if first is None:
                    first = current
                current = []
        if self.drop_last or not current:
            return
        filler = first if first is not None else list(current)
        while len(current) < global_size:
            current += filler
        yield from current[lo:hi]

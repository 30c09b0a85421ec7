"""`DataLoaderDispatcher`: the main process reads, every process receives its slice.

For data that cannot be sharded by index (streams, iterable datasets), process 0 iterates the
underlying loader alone. Each round it takes one batch (``split_batches``) or ``num_processes``
batches (concatenated), broadcasts the result and every process keeps its slice. Process 0
reads one round ahead, so the broadcast of a round also says whether it is the last one; the
final round is padded with the first samples of the epoch when its size does not divide evenly,
and `remainder` records the real size so gather_for_metrics can drop the padding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from torch.utils.data.datapipes.datapipe import IterDataPipe

from hasten.core.nested import (
    concatenate,
    find_batch_size,
    get_data_structure,
    initialize_tensors,
    send_to_device,
    slice_tensors,
)
from hasten.data_loader.base import ResumableDataLoader
from hasten.data_loader.pipeline_rng import restore_global_rng
from hasten.ops.collectives import broadcast, broadcast_object_list
from hasten.state import PartialState
from hasten.state.mesh import data_parallel_share

__all__ = ["DataLoaderDispatcher"]


def _concatenate_round(batches: list[Any]) -> Any:
    try:
        return concatenate(batches, dim=0)
    except RuntimeError as error:
        raise RuntimeError(
            "dispatch_batches=True needs batches of the same shape within a round: "
            f"{error}. Pass dispatch_batches=False so each process reads its own batches, "
            "or split_batches=True so the main process reads one batch and cuts it."
        ) from error


class DataLoaderDispatcher(ResumableDataLoader):
    """A `DataLoader` iterated on the main process only, whose batches are split and broadcast.

    Args:
        dataset: the dataset to load from (read by the main process only).
        split_batches: cut each batch of the underlying loader across processes instead of
            concatenating ``num_processes`` batches and cutting that.
        skip_batches: dispatched batches to skip at the start of every iteration.
        use_stateful_dataloader: back this loader with torchdata's ``StatefulDataLoader``.
        slice_fn: how to cut a batch: ``slice_fn(batch, slice, process_index=, num_processes=)``;
            defaults to `slice_tensors`.
        torch_device_mesh: the job's mesh: batches are cut between its data-parallel ranks
            only (processes of one tensor/context-parallel group get the same slice).
        iteration: the epoch to start from.
        **kwargs: forwarded to `DataLoader`.
    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable[..., Any] | None = None,
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
        self.split_batches = split_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.slice_fn = slice_tensors if slice_fn is None else slice_fn
        self.torch_device_mesh = torch_device_mesh

    @property
    def state(self) -> PartialState:
        """The shared `PartialState` (looked up, not stored, so the loader stays picklable)."""
        return PartialState()

    @property
    def _share(self) -> tuple[int, int]:
        """(data-parallel replicas, this process's replica index)."""
        state = self.state
        return data_parallel_share(self.torch_device_mesh, state.num_processes, state.process_index)

    @property
    def _round_size(self) -> int:
        return 1 if self.split_batches else self._share[0]

    def _on_round_start(self) -> None:
        """Hook run before reading each round (the stateful variant snapshots here)."""

    def _rounds(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """Main process: yield one concatenated batch per round of the underlying loader."""
        size = self._round_size
        while True:
            self._on_round_start()
            batches = list(islice(iterator, size))
            if not batches or (len(batches) < size and self._drop_last):
                return
            yield batches[0] if size == 1 else _concatenate_round(batches)
            if len(batches) < size:
                return

    def _base_iterator(self, skip: int) -> Iterator[Any]:
        # Skipping happens in the underlying loader: whole rounds of its batches.
        return super()._base_iterator(skip * self._round_size)

    def _tracks_pipeline(self) -> bool:
        return False  # batches are made on the main process only, a round at a time

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        skip, restore_rng = self._start_epoch()
        self.begin()
        state = self.state
        try:
            rounds: Iterator[Any] | None = None
            if state.process_index == 0:
                rounds = self._rounds(self._base_iterator(skip))
            elif isinstance(self.dataset, IterDataPipe):
                # DataPipes agree on a shuffle seed through a collective when the iterator is
                # created, so every process must create one (only process 0 reads it).
                super()._base_iterator(0)
            current = next(rounds, None) if rounds is not None else None
            if restore_rng is not None:
                restore_global_rng(restore_rng)
            yield from self._dispatch(rounds, current, skip)
        finally:
            self.end()

    def _receive(self, rounds: Iterator[Any] | None, current: Any) -> tuple[Any, Any, bool]:
        """Broadcast the current round; return (it on this process, next round, is last)."""
        state = self.state
        upcoming = next(rounds, None) if rounds is not None else None
        info = [None, True]
        if state.process_index == 0 and current is not None:
            info = [get_data_structure(current), upcoming is None]
        broadcast_object_list(info)
        if info[0] is None:
            return None, None, True
        batch = current if state.process_index == 0 else initialize_tensors(info[0])
        batch = send_to_device(batch, state.device, non_blocking=self._non_blocking)
        return broadcast(batch, from_process=0), upcoming, bool(info[1])

    def _dispatch(self, rounds: Iterator[Any] | None, current: Any, position: int) -> Iterator[Any]:
        n, rank = self._share
        head: Any = None
        boundary = self._boundary_hook()
        while True:
            batch, current, last = self._receive(rounds, current)
            if batch is None:
                self._position = None
                return
            if head is None and not self._drop_last:
                head = self.slice_fn(batch, slice(0, n), process_index=rank, num_processes=n)
            observed = find_batch_size(batch)
            per_process = observed // n
            if last and not self._drop_last and observed % n != 0:
                # Complete the last round with the first samples of the epoch.
                batch = concatenate([batch, head], dim=0)
                per_process += 1
            window = slice(rank * per_process, (rank + 1) * per_process)
            mine = self.slice_fn(batch, window, process_index=rank, num_processes=n)
            if last:
                self.end_of_dataloader = True
                self.remainder = observed
                self._position = -1
                yield mine
                self.iteration += 1
                self._position = None
                return
            position += 1
            self._position = position
            yield mine
            if boundary is not None:  # the step on the previous batch is complete
                boundary()

    def __len__(self) -> int:
        whole = super().__len__()
        if self.split_batches:
            return whole
        if self._drop_last:
            return whole // self._share[0]
        return math.ceil(whole / self._share[0])

    @property
    def total_batch_size(self) -> int:
        """Samples in one step across all processes."""
        size = self.batch_size
        if size is None:
            size = int(self.batch_sampler.batch_size)  # type: ignore[union-attr]
        return size if self.split_batches else size * self._share[0]

    @property
    def total_dataset_length(self) -> int:
        """Length of the whole dataset."""
        return len(self.dataset)  # type: ignore[arg-type]

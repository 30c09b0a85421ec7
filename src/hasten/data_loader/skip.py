"""Resume mid-epoch by skipping the batches already seen: `skip_first_batches` and its helpers.

For map-style datasets the skip happens on the batch sampler, so skipped batches are never
loaded; an iterable dataset has no indices, so its skipped batches are read and dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from hasten.data_loader.base import ResumableDataLoader, dataloader_kwargs
from hasten.data_loader.dispatch import DataLoaderDispatcher
from hasten.data_loader.shard import DataLoaderShard

__all__ = ["SkipBatchSampler", "SkipDataLoader", "skip_first_batches"]


class SkipBatchSampler(BatchSampler):
    """A batch sampler that drops the first ``skip_batches`` batches of another one.

    Args:
        batch_sampler: the batch sampler to wrap.
        skip_batches: how many of its first batches to drop.
    """

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        # No super().__init__: everything comes from the wrapped batch sampler.
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    @property
    def sampler(self) -> Any:
        """The index sampler of the wrapped batch sampler (settable)."""
        return getattr(self.batch_sampler, "sampler", None)

    @sampler.setter
    def sampler(self, sampler: Any) -> None:
        self.batch_sampler.sampler = sampler

    @property
    def batch_size(self) -> int | None:  # type: ignore[override]
        """Batch size of the wrapped batch sampler."""
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self) -> bool:  # type: ignore[override]
        """Whether the wrapped batch sampler drops its last incomplete batch."""
        return bool(getattr(self.batch_sampler, "drop_last", False))

    def __iter__(self) -> Iterator[list[int]]:
        return islice(iter(self.batch_sampler), self.skip_batches, None)

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped sampler, skipped ones included."""
        return len(self.batch_sampler)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)


class SkipDataLoader(ResumableDataLoader):
    """A plain `DataLoader` that skips its first ``skip_batches`` batches every iteration.

    Args:
        dataset: the dataset to load from.
        skip_batches: batches to skip at the start of each iteration.
        use_stateful_dataloader: back this loader with torchdata's ``StatefulDataLoader``.
        **kwargs: forwarded to `DataLoader`.
    """

    def __init__(
        self,
        dataset: Any,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset,
            use_stateful_dataloader=use_stateful_dataloader,
            skip_batches=skip_batches,
            **kwargs,
        )
        self._drop_last = bool(kwargs.get("drop_last", False))

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)


def _sampling_kwargs(dataloader: DataLoader[Any], num_batches: int) -> dict[str, Any]:
    """Return the (batch) sampler arguments of a copy of ``dataloader`` that skips."""
    if isinstance(dataloader.dataset, IterableDataset):
        return {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
    if isinstance(dataloader.sampler, BatchSampler):
        # The loader batches through `sampler=` (batch_size=None): keep that shape.
        return {
            "sampler": SkipBatchSampler(dataloader.sampler, num_batches),
            "batch_size": dataloader.batch_size,
        }
    return {"batch_sampler": SkipBatchSampler(dataloader.batch_sampler, num_batches)}


def skip_first_batches(dataloader: DataLoader[Any], num_batches: int = 0) -> DataLoader[Any]:
    """Return a copy of ``dataloader`` whose iteration starts after ``num_batches`` batches.

    Use it to resume mid-epoch: the copy keeps the original's sharding, device placement,
    epoch and RNG synchronization. Prepared loaders also offer `state_dict`/`load_state_dict`,
    which resume without building a new loader.

    Args:
        dataloader: a prepared (`DataLoaderShard`, `DataLoaderDispatcher`) or plain loader.
        num_batches: how many batches (as this process sees them) to skip.

    Returns:
        The copy; after ``load_state`` it replays the saved epoch exactly (same shuffle and
        RNG), and ``dataloader`` itself moves on to the following epoch.
    """
    resume = dataloader._take_resume() if isinstance(dataloader, ResumableDataLoader) else None
    skipped = _rebuild(dataloader, num_batches)
    if resume is not None and isinstance(skipped, ResumableDataLoader):
        # A checkpoint was loaded into `dataloader`: the copy replays that epoch's shuffle and
        # RNG exactly, skipping `num_batches` (the caller's count wins over the saved one).
        skipped.iteration = int(resume["epoch"])
        skipped._resume = dict(resume, batches_yielded=0)
    return skipped


def _rebuild(dataloader: DataLoader[Any], num_batches: int) -> DataLoader[Any]:
    kwargs = dataloader_kwargs(dataloader)
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    if isinstance(dataloader, DataLoaderDispatcher):
        # The dispatcher skips whole rounds of the main process's loader by itself.
        whole: dict[str, Any] = (
            {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
            if iterable
            else {"batch_sampler": dataloader.batch_sampler}
        )
        dispatcher = DataLoaderDispatcher(
            dataset,
            split_batches=dataloader.split_batches,
            skip_batches=num_batches,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            slice_fn=dataloader.slice_fn,
            iteration=dataloader.iteration,
            **whole,
            **kwargs,
        )
        dispatcher._follow(dataloader, 0)
        return dispatcher
    sampling = _sampling_kwargs(dataloader, num_batches)
    if isinstance(dataloader, DataLoaderShard):
        shard = DataLoaderShard(
            dataset,
            device=dataloader.device,
            rng_types=dataloader.rng_types,
            synchronized_generator=dataloader.synchronized_generator,
            skip_batches=num_batches if iterable else 0,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            iteration=dataloader.iteration,
            **sampling,
            **kwargs,
        )
        # A map-style copy drops the batches in its batch sampler; an iterable one counts them.
        shard._follow(dataloader, 0 if iterable else num_batches)
        return shard
    if iterable:
        return SkipDataLoader(dataset, skip_batches=num_batches, **sampling, **kwargs)
    return DataLoader(dataset, **sampling, **kwargs)

"""`prepare_data_loader`: turn a user's `DataLoader` into this process's share of it.

Everything is decided here, once: which sharding (batch sampler, iterable stream or dispatch
from the main process), whether batches move to a device, which RNGs are synchronized each
epoch. The loader returned does no such branching per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from hasten.core.imports import is_package_available
from hasten.data_loader.base import dataloader_kwargs
from hasten.data_loader.dispatch import DataLoaderDispatcher
from hasten.data_loader.iterable import IterableDatasetShard
from hasten.data_loader.samplers import BatchSamplerShard, SeedableRandomSampler, get_sampler
from hasten.data_loader.shard import DataLoaderShard
from hasten.state import PartialState
from hasten.state.mesh import data_parallel_share

__all__ = ["prepare_data_loader"]


def _batch_size_for_split(dataloader: DataLoader[Any], num_processes: int) -> None:
    size = dataloader.batch_size
    if size is None:
        size = getattr(dataloader.batch_sampler, "batch_size", None)
    if size is None:
        size = getattr(dataloader.sampler, "batch_size", None)
    if not isinstance(size, int):
        raise ValueError(
            "split_batches=True needs to know the batch size, but the dataloader's batch_size "
            f"is None and its batch sampler ({type(dataloader.batch_sampler).__name__}) has no "
            "`batch_size` attribute. Give the batch sampler a `batch_size` or set "
            "split_batches=False."
        )
    if size % num_processes != 0:
        raise ValueError(
            f"To use a `DataLoader` in `split_batches` mode, the batch size ({size!r}) needs to "
            f"be a round multiple of the number of processes ({num_processes!r}): each batch is "
            f"cut across the processes. Use a batch size divisible by {num_processes}, or "
            "split_batches=False."
        )


def _seedable(sampler: RandomSampler, data_seed: int | None) -> SeedableRandomSampler:
    return SeedableRandomSampler(
        data_source=sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=sampler.generator,
        data_seed=data_seed,
    )


def _shard_iterable(
    dataloader: DataLoader[Any], num_processes: int, process_index: int, split_batches: bool
) -> Any:
    dataset = dataloader.dataset
    if is_package_available("datasets") and not split_batches:
        # optional: datasets
        from datasets import IterableDataset as HFIterableDataset

        if isinstance(dataset, HFIterableDataset) and dataset.n_shards >= num_processes:
            return dataset.shard(num_shards=num_processes, index=process_index)
    return IterableDatasetShard(
        dataset,  # type: ignore[arg-type]
        batch_size=dataloader.batch_size or 1,
        drop_last=dataloader.drop_last,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
    )


def _shared_generator(sampler: Any) -> torch.Generator | None:
    """Give the sampler a generator (seeded from torch's RNG) that is synced every epoch."""
    if not hasattr(sampler, "generator"):
        return None
    if sampler.generator is None:
        generator = torch.Generator(device=torch.get_default_device())
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        sampler.generator = generator
    return sampler.generator


def _rebuild_kwargs(
    dataloader: DataLoader[Any], batch_sampler: Any, as_sampler: bool, divide_batch_by: int
) -> dict[str, Any]:
    """Constructor arguments of the prepared loader: the original's, with the new sampling."""
    kwargs = dataloader_kwargs(dataloader)
    if batch_sampler is None:  # iterable dataset: the loader batches the (sharded) stream
        kwargs["drop_last"] = dataloader.drop_last
        size = dataloader.batch_size
        kwargs["batch_size"] = size // divide_batch_by if size is not None else None
    elif as_sampler:
        kwargs["sampler"] = batch_sampler
        kwargs["batch_size"] = dataloader.batch_size
    else:
        kwargs["batch_sampler"] = batch_sampler
    return kwargs


def prepare_data_loader(
    dataloader: DataLoader[Any],
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoader[Any]:
    """Wrap ``dataloader`` so that it yields only this process's batches.

    Args:
        dataloader: the loader to shard.
        device: where batches go when ``put_on_device`` is set.
        num_processes: processes sharing the data (default: from `PartialState`).
        process_index: this process's index (default: from `PartialState`).
        split_batches: cut each batch across processes (batch size stays the same overall)
            instead of giving each process whole batches (batch size times num_processes).
        put_on_device: move every batch to ``device``.
        rng_types: RNGs to synchronize from the main process at each epoch start.
        dispatch_batches: read on the main process only and broadcast slices; defaults to
            True for an `IterableDataset` when ``put_on_device``, else False.
        even_batches: complete the last round with samples from the start so that every
            process gets as many batches of the same size.
        slice_fn_for_dispatch: how the dispatcher cuts batches (default `slice_tensors`).
        use_seedable_sampler: replace a `RandomSampler` by a `SeedableRandomSampler`.
        data_seed: the seed of the seedable sampler (default: torch's initial seed).
        non_blocking: asynchronous host-to-device copies (useful with pin_memory).
        use_stateful_dataloader: back the result with torchdata's ``StatefulDataLoader``.
        torch_device_mesh: the job's mesh; only its data-parallel ranks split the data, and
            processes of one tensor/context-parallel group get the same batches.

    Returns:
        A `DataLoaderShard` or `DataLoaderDispatcher`.

    Raises:
        ValueError: dispatching without ``put_on_device``, or ``split_batches`` with a batch
            size that is unknown or not a multiple of the number of processes.
    """
    if dispatch_batches is None:
        dispatch_batches = put_on_device and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise ValueError(
            "dispatch_batches=True broadcasts batches from the main process, which needs them "
            "on the device: pass put_on_device=True (or dispatch_batches=False)."
        )
    state = PartialState()
    num_processes = state.num_processes if num_processes is None else num_processes
    process_index = state.process_index if process_index is None else process_index
    if torch_device_mesh is not None:
        num_processes, process_index = data_parallel_share(
            torch_device_mesh, num_processes, process_index
        )
    if split_batches:
        _batch_size_for_split(dataloader, num_processes)

    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    batch_sampler_as_sampler = isinstance(dataloader.sampler, BatchSampler)
    batch_sampler = None
    if not iterable:
        batch_sampler = dataloader.sampler if batch_sampler_as_sampler else dataloader.batch_sampler
    synchronized_generator = None
    sampler = get_sampler(dataloader)
    if use_seedable_sampler and isinstance(sampler, RandomSampler):
        sampler = _seedable(sampler, data_seed)

    if num_processes != 1 and not dispatch_batches:
        if iterable:
            synchronized_generator = getattr(dataset, "generator", None)
            dataset = _shard_iterable(dataloader, num_processes, process_index, split_batches)
        else:
            if batch_sampler is None:
                raise ValueError(
                    "Cannot shard a DataLoader that does not batch (batch_size=None without a "
                    f"batch sampler) across {num_processes} processes: give it a batch_size or "
                    "a batch_sampler."
                )
            if not use_seedable_sampler:
                synchronized_generator = _shared_generator(sampler)
            batch_sampler = BatchSamplerShard(
                batch_sampler,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
                even_batches=even_batches,
            )

    rng_types = list(rng_types) if rng_types is not None else None
    if rng_types is not None and synchronized_generator is None and "generator" in rng_types:
        rng_types.remove("generator")

    per_process = num_processes if split_batches and not dispatch_batches else 1
    kwargs = _rebuild_kwargs(dataloader, batch_sampler, batch_sampler_as_sampler, per_process)

    prepared: DataLoaderShard | DataLoaderDispatcher
    if dispatch_batches:
        kwargs.pop("generator", None)
        prepared = DataLoaderDispatcher(
            dataset,
            split_batches=split_batches,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            slice_fn=slice_fn_for_dispatch,
            use_stateful_dataloader=use_stateful_dataloader,
            torch_device_mesh=torch_device_mesh,
            **kwargs,
        )
    else:
        prepared = DataLoaderShard(
            dataset,
            device=device if put_on_device else None,
            rng_types=rng_types,
            synchronized_generator=synchronized_generator,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            use_stateful_dataloader=use_stateful_dataloader,
            torch_device_mesh=torch_device_mesh,
            **kwargs,
        )
    if use_seedable_sampler and isinstance(sampler, SeedableRandomSampler):
        prepared.set_sampler(sampler)
    return prepared

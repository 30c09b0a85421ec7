"""Sharded, dispatched and resumable data loading (``accelerate.data_loader``'s names)."""

from hasten.data_loader.base import DataLoaderAdapter, DataLoaderStateMixin
from hasten.data_loader.dispatch import DataLoaderDispatcher
from hasten.data_loader.iterable import IterableDatasetShard
from hasten.data_loader.prepare import prepare_data_loader
from hasten.data_loader.samplers import BatchSamplerShard, SeedableRandomSampler, get_sampler
from hasten.data_loader.shard import DataLoaderShard
from hasten.data_loader.skip import SkipBatchSampler, SkipDataLoader, skip_first_batches

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]

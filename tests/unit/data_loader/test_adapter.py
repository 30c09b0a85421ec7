"""DataLoaderAdapter (Accelerate's base loader name), base_dataloader, SeedableRandomSampler kwargs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from hasten.data_loader import (
    DataLoaderAdapter,
    DataLoaderShard,
    SeedableRandomSampler,
    SkipDataLoader,
)


def test_adapter_is_a_dataloader_and_its_own_base() -> None:
    data = list(range(6))
    loader = DataLoaderAdapter(data, batch_size=2)
    assert isinstance(loader, DataLoader)
    assert loader.base_dataloader is loader
    # an attribute of instances, as in Accelerate (where __init__ sets it)
    with pytest.raises(
        AttributeError, match="'DataLoaderAdapter' has no attribute 'base_dataloader'"
    ):
        _ = DataLoaderAdapter.base_dataloader
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    sampler = BatchSampler(SequentialSampler(data), batch_size=3, drop_last=False)
    assert [b.tolist() for b in DataLoaderAdapter(data, batch_sampler=sampler)] == [
        [0, 1, 2],
        [3, 4, 5],
    ]


def test_prepared_loaders_are_adapters_with_a_base_dataloader() -> None:
    skip = SkipDataLoader(list(range(6)), skip_batches=1, batch_size=2)
    assert isinstance(skip, DataLoaderAdapter) and skip.base_dataloader is skip
    assert [b.tolist() for b in skip] == [[2, 3], [4, 5]]
    assert issubclass(DataLoaderShard, DataLoaderAdapter)


def test_seedable_sampler_takes_data_seed_as_a_keyword() -> None:
    first = list(SeedableRandomSampler(range(10), data_seed=3))
    again = list(SeedableRandomSampler(range(10), data_seed=3))
    assert first == again and sorted(first) == list(range(10))
    generator = torch.Generator().manual_seed(0)
    sampler = SeedableRandomSampler(range(5), generator=generator, data_seed=11)
    assert sampler.initial_seed == 11 and sampler.generator is generator

"""prepare_data_loader with explicit num_processes/process_index: no processes needed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from hasten.data_loader import (
    BatchSamplerShard,
    DataLoaderDispatcher,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    prepare_data_loader,
)


class Stream(IterableDataset[torch.Tensor]):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(float(self.length)))

    def __len__(self) -> int:
        return self.length


def _per_process(loader: DataLoader, n: int, **kwargs: object) -> list[list[list[float]]]:  # type: ignore[type-arg]
    return [
        [
            b.tolist()
            for b in prepare_data_loader(loader, num_processes=n, process_index=r, **kwargs)
        ]  # type: ignore[arg-type]
        for r in range(n)
    ]


def test_single_process_keeps_the_batches() -> None:
    loader = DataLoader(torch.arange(5.0), batch_size=2)
    prepared = prepare_data_loader(loader, num_processes=1, process_index=0)
    assert isinstance(prepared, DataLoaderShard)
    assert prepared.batch_sampler is loader.batch_sampler
    assert [b.tolist() for b in prepared] == [[0, 1], [2, 3], [4]]


def test_map_style_is_sharded_by_batch_sampler() -> None:
    loader = DataLoader(torch.arange(8.0), batch_size=2)
    prepared = prepare_data_loader(loader, num_processes=2, process_index=1)
    assert isinstance(prepared.batch_sampler, BatchSamplerShard)
    assert _per_process(loader, 2) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


@pytest.mark.parametrize("even_batches", [True, False])
def test_uneven_data_with_and_without_even_batches(even_batches: bool) -> None:
    loader = DataLoader(torch.arange(5.0), batch_size=2)
    shards = _per_process(loader, 2, even_batches=even_batches)
    if even_batches:
        assert shards == [[[0, 1], [4, 0]], [[2, 3], [1, 2]]]
    else:
        assert shards == [[[0, 1], [4]], [[2, 3]]]


def test_drop_last() -> None:
    loader = DataLoader(torch.arange(7.0), batch_size=2, drop_last=True)
    assert _per_process(loader, 2) == [[[0, 1]], [[2, 3]]]


def test_split_batches() -> None:
    loader = DataLoader(torch.arange(8.0), batch_size=4)
    assert _per_process(loader, 2, split_batches=True) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_split_batches_needs_a_divisible_batch_size() -> None:
    with pytest.raises(
        ValueError,
        match=r"batch size \(3\) needs to be a round multiple of the number of processes \(2\)",
    ):
        prepare_data_loader(
            DataLoader(torch.arange(8.0), batch_size=3),
            num_processes=2,
            process_index=0,
            split_batches=True,
        )


def test_split_batches_needs_a_known_batch_size() -> None:
    class NoSize:
        def __iter__(self) -> Iterator[list[int]]:
            return iter([[0, 1]])

        def __len__(self) -> int:
            return 1

    loader = DataLoader(torch.arange(2.0), batch_sampler=NoSize())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="split_batches=True needs to know the batch size"):
        prepare_data_loader(loader, num_processes=2, process_index=0, split_batches=True)


def test_dispatch_needs_put_on_device() -> None:
    with pytest.raises(ValueError, match="pass put_on_device=True"):
        prepare_data_loader(DataLoader(torch.arange(4.0)), dispatch_batches=True)


def test_iterable_dataset_is_sharded_by_batch() -> None:
    loader = DataLoader(Stream(8), batch_size=2)
    prepared = prepare_data_loader(loader, num_processes=2, process_index=0)
    assert isinstance(prepared.dataset, IterableDatasetShard)
    assert _per_process(loader, 2) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert _per_process(loader, 2, split_batches=True) == [
        [[0], [2], [4], [6]],
        [[1], [3], [5], [7]],
    ]


def test_iterable_dataset_dispatches_by_default_when_placed() -> None:
    loader = DataLoader(Stream(4), batch_size=2)
    prepared = prepare_data_loader(loader, device=torch.device("cpu"), put_on_device=True)
    assert isinstance(prepared, DataLoaderDispatcher)
    # One process: the dispatcher hands out the batches unchanged.
    assert [b.tolist() for b in prepared] == [[0, 1], [2, 3]]
    assert isinstance(prepare_data_loader(loader), DataLoaderShard)


def test_batch_sampler_given_as_sampler() -> None:
    loader = DataLoader(
        torch.arange(8.0),
        sampler=BatchSampler(SequentialSampler(range(8)), 2, False),
        batch_size=None,
    )
    shards = _per_process(loader, 2)
    assert shards == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_seedable_sampler_same_shuffle_on_every_process_and_new_each_epoch() -> None:
    loader = DataLoader(torch.arange(12.0), batch_size=3, shuffle=True)
    prepared = [
        prepare_data_loader(
            loader, num_processes=2, process_index=r, use_seedable_sampler=True, data_seed=5
        )
        for r in range(2)
    ]
    assert isinstance(prepared[0].get_sampler(), SeedableRandomSampler)
    epoch0 = [[b.tolist() for b in p] for p in prepared]
    union = sorted(x for shard in epoch0 for batch in shard for x in batch)
    assert union == list(range(12))  # same permutation on both: disjoint shards
    epoch1 = [[b.tolist() for b in p] for p in prepared]
    assert epoch1 != epoch0
    assert sorted(x for shard in epoch1 for batch in shard for x in batch) == list(range(12))


def test_random_sampler_gets_a_synchronized_generator_with_several_processes() -> None:
    loader = DataLoader(torch.arange(8.0), batch_size=2, shuffle=True)
    prepared = prepare_data_loader(
        loader, num_processes=2, process_index=0, rng_types=["torch", "generator"]
    )
    assert isinstance(prepared.synchronized_generator, torch.Generator)
    assert prepared.rng_types == ["torch", "generator"]
    plain = prepare_data_loader(
        DataLoader(torch.arange(8.0)), num_processes=2, process_index=0, rng_types=["generator"]
    )
    assert plain.rng_types == []  # nothing to synchronize: "generator" is dropped


def test_loader_settings_are_kept() -> None:
    def collate(batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(batch) * 10

    loader = DataLoader(torch.arange(4.0), batch_size=2, collate_fn=collate, pin_memory=True)
    prepared = prepare_data_loader(loader, num_processes=2, process_index=0)
    assert prepared.collate_fn is collate
    assert prepared.pin_memory is True
    prepared.pin_memory = False  # no accelerator here: avoid torch's warning
    assert [b.tolist() for b in prepared] == [[0.0, 10.0]]


def test_device_mesh_gives_tensor_parallel_ranks_the_same_batches() -> None:
    class Dim:
        def __init__(self, size: int) -> None:
            self._size = size

        def size(self) -> int:
            return self._size

    class Mesh:
        mesh_dim_names = ("dp_shard", "tp")

        def __getitem__(self, name: str) -> Dim:
            return Dim({"dp_shard": 2, "tp": 2}[name])

    loader = DataLoader(torch.arange(8.0), batch_size=2)
    shards = [
        [
            b.tolist()
            for b in prepare_data_loader(
                loader, num_processes=4, process_index=r, torch_device_mesh=Mesh()
            )
        ]
        for r in range(4)
    ]
    assert shards[0] == shards[1] != shards[2] == shards[3]


def test_unbatched_loader_cannot_be_sharded() -> None:
    loader = DataLoader(torch.arange(4.0), batch_size=None)
    with pytest.raises(ValueError, match="Cannot shard a DataLoader that does not batch"):
        prepare_data_loader(loader, num_processes=2, process_index=0)
    single = prepare_data_loader(loader, num_processes=1, process_index=0)
    assert [b.item() for b in single] == [0.0, 1.0, 2.0, 3.0]

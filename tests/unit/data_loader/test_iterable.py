"""IterableDatasetShard: every process reads the stream and keeps its slice of each batch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import IterableDataset

from hasten.data_loader.iterable import IterableDatasetShard


class Stream(IterableDataset[int]):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.length))

    def __len__(self) -> int:
        return self.length


def _shards(length: int, batch_size: int, n: int, **kwargs: bool) -> list[list[int]]:
    return [
        list(
            IterableDatasetShard(
                Stream(length), batch_size, num_processes=n, process_index=r, **kwargs
            )
        )
        for r in range(n)
    ]


def test_whole_batches_per_process() -> None:
    assert _shards(8, 2, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_split_batches_slices_each_batch() -> None:
    assert _shards(8, 4, 2, split_batches=True) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_last_batch_completed_from_the_first_one() -> None:
    assert _shards(6, 2, 2) == [[0, 1, 4, 5], [2, 3, 0, 1]]


def test_drop_last_drops_the_incomplete_batch() -> None:
    assert _shards(6, 2, 2, drop_last=True) == [[0, 1], [2, 3]]


def test_stream_shorter_than_one_batch_is_repeated() -> None:
    assert _shards(3, 2, 2) == [[0, 1], [2, 0]]


@pytest.mark.parametrize("length", [0, 5, 8, 11])
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_matches_iteration(length: int, drop_last: bool) -> None:
    for rank in range(3):
        shard = IterableDatasetShard(Stream(length), 2, drop_last, 3, rank)
        assert len(shard) == len(list(shard))


def test_split_batches_with_indivisible_batch_size_raises() -> None:
    with pytest.raises(
        ValueError,
        match=r"batch size \(3\) needs to be a round multiple of the number of processes \(2\)",
    ):
        IterableDatasetShard(Stream(4), batch_size=3, num_processes=2, split_batches=True)


def test_set_epoch_reaches_the_dataset() -> None:
    class WithEpoch(Stream):
        epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    inner = WithEpoch(4)
    shard = IterableDatasetShard(inner)
    shard.set_epoch(3)
    assert (shard.epoch, inner.epoch) == (3, 3)


def test_dataset_generator_is_reseeded_with_the_epoch() -> None:
    class Shuffled(IterableDataset[int]):
        def __init__(self) -> None:
            self.generator = torch.Generator()

        def __iter__(self) -> Iterator[int]:
            return iter(torch.randperm(10, generator=self.generator).tolist())

    a, b = IterableDatasetShard(Shuffled()), IterableDatasetShard(Shuffled())
    a.epoch = b.epoch = 2
    assert list(a) == list(b)
    b.epoch = 3
    assert list(a) != list(b)

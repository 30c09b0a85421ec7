"""BatchSamplerShard and SeedableRandomSampler: sharding decided by (num_processes, process_index)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from hasten.data_loader.samplers import BatchSamplerShard, SeedableRandomSampler, get_sampler


def _batches(length: int, batch_size: int, drop_last: bool = False) -> BatchSampler:
    return BatchSampler(SequentialSampler(range(length)), batch_size, drop_last)


def _shards(length: int, batch_size: int, n: int, **kwargs: object) -> list[list[list[int]]]:
    drop_last = bool(kwargs.pop("drop_last", False))
    return [
        list(BatchSamplerShard(_batches(length, batch_size, drop_last), n, rank, **kwargs))  # type: ignore[arg-type]
        for rank in range(n)
    ]


def test_round_robin_whole_batches_when_even() -> None:
    assert _shards(16, 4, 2) == [[[0, 1, 2, 3], [8, 9, 10, 11]], [[4, 5, 6, 7], [12, 13, 14, 15]]]


def test_even_batches_completes_last_round_from_the_start() -> None:
    # 3 batches for 2 processes: process 1's second batch wraps around to the first samples.
    assert _shards(12, 4, 2) == [[[0, 1, 2, 3], [8, 9, 10, 11]], [[4, 5, 6, 7], [0, 1, 2, 3]]]
    # A short last batch is completed too.
    assert _shards(10, 4, 2) == [[[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]]]


def test_uneven_without_even_batches_gives_shorter_shards() -> None:
    assert _shards(10, 4, 2, even_batches=False) == [
        [[0, 1, 2, 3], [8, 9]],
        [[4, 5, 6, 7]],
    ]


def test_drop_last_drops_incomplete_rounds() -> None:
    assert _shards(12, 4, 2, drop_last=True) == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]


def test_split_batches_slices_every_batch() -> None:
    assert _shards(8, 4, 2, split_batches=True) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    # Short last batch completed from the first batch.
    assert _shards(6, 4, 2, split_batches=True) == [[[0, 1], [4, 5]], [[2, 3], [0, 1]]]
    assert _shards(6, 4, 2, split_batches=True, even_batches=False) == [
        [[0, 1], [4, 5]],
        [[2, 3]],
    ]


def test_dataset_smaller_than_one_round_is_repeated() -> None:
    assert _shards(3, 4, 2) == [[[0, 1, 2, 0]], [[1, 2, 0, 1]]]


@pytest.mark.parametrize("length", [0, 1, 7, 12, 13, 24])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_matches_iteration_and_union_covers_data(
    length: int, n: int, split: bool, even: bool, drop_last: bool
) -> None:
    batch_size = 6 if split else 4
    shards = [
        BatchSamplerShard(_batches(length, batch_size, drop_last), n, r, split, even)
        for r in range(n)
    ]
    lists = [list(s) for s in shards]
    assert [len(s) for s in shards] == [len(x) for x in lists]
    seen = [i for shard in lists for batch in shard for i in batch]
    if drop_last:
        assert len(seen) == len(set(seen))
        assert set(seen) <= set(range(length))
    else:
        assert set(seen) == set(range(length))
    if even and not drop_last and length > 0:
        # Every process gets as many batches, all of the per-process batch size.
        per_process = batch_size // n if split else batch_size
        assert len({len(x) for x in lists}) == 1
        assert {len(b) for shard in lists for b in shard} == {per_process}


def test_union_of_shards_is_the_dataset_without_duplicates_when_divisible() -> None:
    shards = _shards(24, 4, 3)
    flat = sorted(i for shard in shards for batch in shard for i in batch)
    assert flat == list(range(24))


def test_batch_sampler_without_batch_size() -> None:
    class Varying:
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([[0, 1], [2], [3, 4, 5]])

        def __len__(self) -> int:
            return 3

    shards = [list(BatchSamplerShard(Varying(), 2, r)) for r in range(2)]  # type: ignore[arg-type]
    assert shards == [[[0, 1], [3, 4, 5]], [[2], [0, 1]]]


def test_split_batches_with_indivisible_batch_size_raises() -> None:
    with pytest.raises(
        ValueError,
        match=r"batch size \(3\) needs to be a round multiple of the number of processes \(2\)",
    ):
        BatchSamplerShard(_batches(10, 3), 2, 0, split_batches=True)


def test_sampler_property_reaches_the_wrapped_batch_sampler() -> None:
    inner = _batches(8, 2)
    shard = BatchSamplerShard(inner, 2, 0)
    assert shard.sampler is inner.sampler
    new = SequentialSampler(range(8))
    shard.sampler = new
    assert inner.sampler is new


def test_seedable_sampler_same_order_for_same_seed_and_epoch() -> None:
    a = SeedableRandomSampler(range(20), data_seed=7)
    b = SeedableRandomSampler(range(20), data_seed=7)
    first = list(a)
    assert first == list(b)
    assert sorted(first) == list(range(20))
    # After a full pass the epoch advances: a new permutation, again identical on both.
    assert a.epoch == 1
    second = list(a)
    assert second != first
    assert second == list(b)


def test_seedable_sampler_set_epoch_and_state_dict() -> None:
    a = SeedableRandomSampler(range(20), data_seed=3)
    a.set_epoch(5)
    order = list(a)
    b = SeedableRandomSampler(range(20), data_seed=99)
    b.load_state_dict({"initial_seed": 3, "epoch": 5})
    assert list(b) == order
    assert b.state_dict() == {"initial_seed": 3, "epoch": 6}


def test_seedable_sampler_defaults_to_torch_initial_seed() -> None:
    torch.manual_seed(1234)
    assert SeedableRandomSampler(range(4)).initial_seed == 1234


def test_get_sampler_finds_the_index_sampler() -> None:
    loader = torch.utils.data.DataLoader(range(10), batch_size=2, shuffle=True)
    assert get_sampler(loader) is loader.batch_sampler.sampler
    as_sampler = torch.utils.data.DataLoader(range(10), sampler=_batches(10, 2), batch_size=None)
    assert isinstance(get_sampler(as_sampler), SequentialSampler)

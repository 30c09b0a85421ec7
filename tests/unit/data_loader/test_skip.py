"""skip_first_batches and its helpers: resume by skipping what was already seen."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from hasten.data_loader import (
    DataLoaderShard,
    SkipBatchSampler,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from hasten.state import GradientState


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(7.0))


class Loud(torch.utils.data.Dataset[int]):
    """Counts how many samples were loaded."""

    def __init__(self) -> None:
        self.loaded = 0

    def __getitem__(self, index: int) -> int:
        self.loaded += 1
        return index

    def __len__(self) -> int:
        return 10


def test_skip_batch_sampler() -> None:
    inner = BatchSampler(SequentialSampler(range(10)), 3, False)
    skip = SkipBatchSampler(inner, 2)
    assert list(skip) == [[6, 7, 8], [9]]
    assert (len(skip), skip.total_length, skip.batch_size, skip.drop_last) == (2, 4, 3, False)
    assert skip.sampler is inner.sampler


def test_plain_loader_skips_without_loading_the_skipped_samples() -> None:
    data = Loud()
    skipped = skip_first_batches(DataLoader(data, batch_size=2), 3)
    assert type(skipped) is DataLoader
    assert [b.tolist() for b in skipped] == [[6, 7], [8, 9]]
    assert data.loaded == 4
    assert len(skipped) == 2


def test_prepared_loader_keeps_its_settings() -> None:
    prepared = prepare_data_loader(
        DataLoader(torch.arange(10), batch_size=2), device=torch.device("meta"), put_on_device=True
    )
    skipped = skip_first_batches(prepared, 2)
    assert isinstance(skipped, DataLoaderShard)
    batches = list(skipped)
    assert len(batches) == len(skipped) == 3
    assert all(b.device.type == "meta" for b in batches)


def test_prepared_loader_flags_the_end_after_skipping() -> None:
    state = GradientState()
    skipped = skip_first_batches(prepare_data_loader(DataLoader(torch.arange(6), batch_size=2)), 1)
    assert [state.end_of_dataloader for _ in skipped] == [False, True]


def test_iterable_dataset_skips_by_reading() -> None:
    skipped = skip_first_batches(DataLoader(Stream(), batch_size=2), 2)
    assert isinstance(skipped, SkipDataLoader)
    assert [b.tolist() for b in skipped] == [[4.0, 5.0], [6.0]]
    prepared = skip_first_batches(prepare_data_loader(DataLoader(Stream(), batch_size=2)), 3)
    assert [b.tolist() for b in prepared] == [[6.0]]


def test_loader_batching_through_its_sampler() -> None:
    loader = DataLoader(
        torch.arange(10),
        sampler=BatchSampler(SequentialSampler(range(10)), 4, False),
        batch_size=None,
    )
    skipped = skip_first_batches(loader, 1)
    assert [b.tolist() for b in skipped] == [[4, 5, 6, 7], [8, 9]]


def test_skip_data_loader_len() -> None:
    loader = SkipDataLoader(torch.arange(10), skip_batches=2, batch_size=3)
    assert len(loader) == 2
    assert [b.tolist() for b in loader] == [[6, 7, 8], [9]]


def _shuffled(seed: int) -> DataLoaderShard:
    torch.manual_seed(seed)
    return prepare_data_loader(DataLoader(torch.arange(9.0), batch_size=2, shuffle=True))  # type: ignore[return-value]


def test_after_load_state_dict_the_copy_replays_the_epoch_and_the_original_moves_on() -> None:
    """The Accelerate recipe: load_state, then skip_first_batches for the first epoch only."""

    def epoch(loader: DataLoader) -> list[tuple[list[float], float]]:  # type: ignore[type-arg]
        return [(b.tolist(), torch.rand(1).item()) for b in loader]

    straight_loader = _shuffled(0)
    straight = epoch(straight_loader) + epoch(straight_loader)
    loader = _shuffled(0)
    seen = []
    for step, batch in enumerate(loader):
        seen.append((batch.tolist(), torch.rand(1).item()))
        if step == 1:
            state, rng = loader.state_dict(), torch.get_rng_state()
            break
    fresh = _shuffled(7)
    fresh.load_state_dict(state)
    torch.set_rng_state(rng)
    copy = skip_first_batches(fresh, 2)
    assert seen + epoch(copy) + epoch(fresh) == straight

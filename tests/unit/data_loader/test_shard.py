"""DataLoaderShard: end-of-data signal, device placement, epochs and exact mid-epoch resume."""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
)

from hasten.core.imports import install_command
from hasten.data_loader import BatchSamplerShard, DataLoaderShard, prepare_data_loader
from hasten.state import GradientState


def _dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32))


def _values(batch: Any) -> list[float]:
    return batch[0].tolist()


def test_is_a_dataloader_and_yields_every_batch() -> None:
    loader = DataLoaderShard(_dataset(), batch_size=4)
    assert isinstance(loader, DataLoader)
    assert [_values(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(loader) == 3


def test_end_of_dataloader_is_flagged_on_the_last_batch_only() -> None:
    state = GradientState()
    loader = DataLoaderShard(_dataset(), batch_size=4)
    seen = [(state.in_dataloader, state.end_of_dataloader) for _ in loader]
    assert seen == [(True, False), (True, False), (True, True)]
    assert not state.in_dataloader
    assert loader.end_of_dataloader


def test_remainder_is_the_size_of_the_last_global_batch() -> None:
    state = GradientState()
    loader = DataLoaderShard(_dataset(10), batch_size=4)
    for _ in loader:
        assert state.remainder == 2
    dropped = DataLoaderShard(_dataset(10), batch_size=4, drop_last=True, _drop_last=True)
    for _ in dropped:
        assert state.remainder == -1


def test_nested_loaders_restore_the_outer_one() -> None:
    state = GradientState()
    outer = DataLoaderShard(_dataset(4), batch_size=2)
    inner = DataLoaderShard(_dataset(2), batch_size=2)
    for _ in outer:
        for _ in inner:
            assert state.active_dataloader is inner
        assert state.active_dataloader is outer


def test_breaking_out_unregisters_the_loader() -> None:
    state = GradientState()
    loader = DataLoaderShard(_dataset(), batch_size=2)
    for _ in loader:
        break
    assert not state.in_dataloader


def test_batches_move_to_a_non_cpu_device() -> None:
    loader = DataLoaderShard(_dataset(4), device="meta", batch_size=2)
    assert all(b[0].device.type == "meta" for b in loader)
    # A CPU target needs no copy: the batches are the collated ones, untouched.
    assert DataLoaderShard(_dataset(4), device="cpu", batch_size=2)._move_to is None
    loader.device = None
    assert all(b[0].device.type == "cpu" for b in loader)


def test_empty_dataset_yields_nothing() -> None:
    assert list(DataLoaderShard(_dataset(0), batch_size=2)) == []


def test_set_epoch_reaches_sampler_and_dataset() -> None:
    class Epochs(SequentialSampler):
        epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    sampler = Epochs(range(4))
    loader = DataLoaderShard(_dataset(4), batch_sampler=BatchSampler(sampler, 2, False))
    loader.set_epoch(3)
    assert (loader.iteration, sampler.epoch) == (3, 3)
    list(loader)
    assert loader.iteration == 4  # one full pass later


def test_total_batch_size_counts_every_process() -> None:
    shard = BatchSamplerShard(BatchSampler(SequentialSampler(range(16)), 4, False), 2, 0)
    assert DataLoaderShard(_dataset(16), batch_sampler=shard).total_batch_size == 8
    split = BatchSamplerShard(BatchSampler(SequentialSampler(range(16)), 4, False), 2, 0, True)
    assert DataLoaderShard(_dataset(16), batch_sampler=split).total_batch_size == 4
    assert DataLoaderShard(_dataset(16), batch_size=4).total_dataset_length == 16


def _shuffled(seed: int) -> DataLoaderShard:
    torch.manual_seed(seed)
    return prepare_data_loader(DataLoader(_dataset(11), batch_size=3, shuffle=True))  # type: ignore[return-value]


def _train(loader: DataLoaderShard, epochs: int, stop: tuple[int, int] | None = None) -> Any:
    """Record each batch and a random draw per step (standing in for dropout)."""
    record = []
    for epoch in range(epochs):
        for step, batch in enumerate(loader):
            record.append((_values(batch), torch.rand(1).item()))
            if stop == (epoch, step):
                return record, loader.state_dict(), torch.get_rng_state()
    return record


@pytest.mark.parametrize("stop", [(0, 0), (0, 1), (1, 2), (0, 3)])
def test_resume_mid_epoch_is_exact(stop: tuple[int, int]) -> None:
    straight = _train(_shuffled(0), epochs=3)
    first, state, rng = _train(_shuffled(0), epochs=3, stop=stop)
    resumed = _shuffled(1)  # a fresh process: different RNG until the checkpoint is loaded
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    rest = _train(resumed, epochs=3 - state["epoch"])
    assert first + rest == straight


def test_resume_with_worker_processes() -> None:
    # Worker iterators read the index sampler twice before starting: the skip must survive.
    def loader() -> DataLoaderShard:
        return DataLoaderShard(_dataset(12), batch_size=2, num_workers=2, persistent_workers=True)

    first = loader()
    iterator = iter(first)
    next(iterator), next(iterator)
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    assert [_values(b) for b in resumed] == [[4, 5], [6, 7], [8, 9], [10, 11]]
    assert len(list(resumed)) == 6  # the next epoch is whole again


def test_state_dict_reports_position_and_epoch() -> None:
    loader = DataLoaderShard(_dataset(6), batch_size=2)
    assert loader.state_dict() == {"epoch": 0, "batches_yielded": 0}
    iterator = iter(loader)
    next(iterator)
    assert loader.state_dict()["batches_yielded"] == 1
    next(iterator), next(iterator)  # the last batch: the epoch counts as done
    assert loader.state_dict() == {"epoch": 1, "batches_yielded": 0}
    assert list(iterator) == []
    assert loader.state_dict() == {"epoch": 1, "batches_yielded": 0}


def test_loaded_state_is_reported_until_used() -> None:
    loader = DataLoaderShard(_dataset(6), batch_size=2)
    loader.load_state_dict({"epoch": 2, "batches_yielded": 1})
    assert loader.state_dict() == {"epoch": 2, "batches_yielded": 1}
    assert [_values(b) for b in loader] == [[2, 3], [4, 5]]
    assert loader.iteration == 3


def test_resume_iterable_dataset_reads_past_consumed_batches() -> None:
    class Stream(IterableDataset[torch.Tensor]):
        def __iter__(self) -> Iterator[torch.Tensor]:
            return iter(torch.arange(7.0))

    loader = DataLoaderShard(Stream(), batch_size=2)
    loader.load_state_dict({"epoch": 0, "batches_yielded": 2})
    assert [b.tolist() for b in loader] == [[4.0, 5.0], [6.0]]


def test_load_state_dict_rejects_foreign_state() -> None:
    loader = DataLoaderShard(_dataset(), batch_size=2)
    with pytest.raises(ValueError, match=r"expected the keys 'epoch' and 'batches_yielded'"):
        loader.load_state_dict({"_num_yielded": 3})


def test_pickles_with_its_position() -> None:
    loader = DataLoaderShard(_dataset(6), batch_size=2, rng_types=None)
    iterator = iter(loader)
    next(iterator)
    copy = pickle.loads(pickle.dumps(loader))
    assert isinstance(copy, DataLoaderShard)
    copy.load_state_dict(loader.state_dict())
    assert [_values(b) for b in copy] == [[2, 3], [4, 5]]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata
def test_stateful_dataloader_backend_resumes() -> None:
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata not installed")
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = DataLoaderShard(_dataset(8), batch_size=2, use_stateful_dataloader=True)
    assert isinstance(loader, DataLoaderShard)
    assert isinstance(loader, StatefulDataLoader)
    iterator = iter(loader)
    assert _values(next(iterator)) == [0, 1]
    state = loader.state_dict()
    again = pickle.loads(pickle.dumps(loader))
    assert type(again) is type(loader)
    fresh = DataLoaderShard(_dataset(8), batch_size=2, use_stateful_dataloader=True)
    fresh.load_state_dict(state)
    assert [_values(b) for b in fresh] == [[2, 3], [4, 5], [6, 7]]


def test_stateful_dataloader_without_torchdata_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hasten.core.imports
    from hasten.data_loader.base import _stateful_variant

    _stateful_variant.cache_clear()
    monkeypatch.setattr(hasten.core.imports, "is_package_available", lambda *a, **k: False)
    try:
        with pytest.raises(
            ImportError,
            match=r"use_stateful_dataloader=True requires 'torchdata'.*"
            + re.escape(install_command("torchdata", "stateful")),
        ):
            DataLoaderShard(_dataset(), batch_size=2, use_stateful_dataloader=True)
    finally:
        _stateful_variant.cache_clear()

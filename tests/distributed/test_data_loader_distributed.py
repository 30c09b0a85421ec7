"""Prepared dataloaders on 2 real gloo processes: sharding, dispatching, resume."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed]


class Stream(IterableDataset[torch.Tensor]):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(float(self.length)))

    def __len__(self) -> int:
        return self.length


def _run(loader: DataLoader[Any], **kwargs: Any) -> dict[str, Any]:
    """Prepare ``loader`` on this process and record what it yields."""
    from hasten.data_loader import prepare_data_loader
    from hasten.state import GradientState, PartialState

    state = PartialState()
    gradient = GradientState()
    prepared = prepare_data_loader(loader, device=state.device, **kwargs)
    batches, ends, remainders = [], [], []
    for batch in prepared:
        batches.append(batch.tolist())
        ends.append(gradient.end_of_dataloader)
        remainders.append(gradient.remainder)
    return {
        "type": type(prepared).__name__,
        "len": len(prepared),
        "batches": batches,
        "ends": ends,
        "remainder": remainders[-1] if remainders else None,
    }


def _dispatch_map(split: bool, drop_last: bool) -> dict[str, Any]:
    loader = DataLoader(torch.arange(11.0), batch_size=4 if split else 2, drop_last=drop_last)
    return _run(loader, put_on_device=True, dispatch_batches=True, split_batches=split)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("split", [False, True])
def test_dispatch_map_style_uneven(split: bool) -> None:
    ranks = run_distributed(_dispatch_map, split, False, world_size=2, timeout=90)
    assert {r["type"] for r in ranks} == {"DataLoaderDispatcher"}
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == ranks[0]["len"]
    # Interleave the ranks' batches as a gather would, then drop the padding (remainder).
    flat: list[float] = []
    for b0, b1 in zip(ranks[0]["batches"], ranks[1]["batches"]):
        flat += b0 + b1
    assert ranks[0]["ends"][-1] and not any(ranks[0]["ends"][:-1])
    last_round = len(ranks[0]["batches"][-1]) * 2
    kept = len(flat) - last_round + ranks[0]["remainder"]
    assert flat[:kept] == list(range(11))
    assert flat[kept:] == list(range(len(flat) - kept))  # padding comes from the start


@pytest.mark.timeout(120)
def test_dispatch_drop_last() -> None:
    ranks = run_distributed(_dispatch_map, False, True, world_size=2, timeout=90)
    # Rounds of 2 batches of 2; the incomplete last round ([8, 9]) is dropped.
    assert ranks[0]["batches"] == [[0.0, 1.0], [4.0, 5.0]]
    assert ranks[1]["batches"] == [[2.0, 3.0], [6.0, 7.0]]
    assert ranks[0]["len"] == 2


def _dispatch_stream() -> dict[str, Any]:
    # Default for an IterableDataset placed on the device: dispatch.
    return _run(DataLoader(Stream(9), batch_size=2), put_on_device=True)


@pytest.mark.timeout(120)
def test_dispatch_iterable_dataset() -> None:
    ranks = run_distributed(_dispatch_stream, world_size=2, timeout=90)
    assert ranks[0]["type"] == "DataLoaderDispatcher"
    assert ranks[0]["batches"] == [[0.0, 1.0], [4.0, 5.0], [8.0]]
    assert ranks[1]["batches"] == [[2.0, 3.0], [6.0, 7.0], [0.0]]
    assert ranks[0]["remainder"] == 1


def _shard_shuffled() -> dict[str, Any]:
    from hasten.state import PartialState

    PartialState()  # joins the process group
    torch.manual_seed(100 + torch.distributed.get_rank())  # deliberately different per rank
    loader = DataLoader(torch.arange(16.0), batch_size=2, shuffle=True)
    return _run(loader, rng_types=["generator"])


@pytest.mark.timeout(120)
def test_shards_are_disjoint_and_cover_the_dataset() -> None:
    ranks = run_distributed(_shard_shuffled, world_size=2, timeout=90)
    assert {r["type"] for r in ranks} == {"DataLoaderShard"}
    values = [x for r in ranks for b in r["batches"] for x in b]
    # The shuffle generator is synchronized from process 0, so the shards never overlap.
    assert sorted(values) == list(range(16))


def _resume_dispatch() -> list[list[float]]:
    from hasten.data_loader import prepare_data_loader, skip_first_batches
    from hasten.state import PartialState

    state = PartialState()
    loader = DataLoader(torch.arange(12.0), batch_size=2)
    prepared = prepare_data_loader(
        loader, device=state.device, put_on_device=True, dispatch_batches=True
    )
    iterator = iter(prepared)
    next(iterator)
    saved = prepared.state_dict()
    del iterator
    again = prepare_data_loader(
        loader, device=state.device, put_on_device=True, dispatch_batches=True
    )
    again.load_state_dict(saved)
    resumed = [b.tolist() for b in again]
    skipped = [b.tolist() for b in skip_first_batches(prepared, 1)]
    assert resumed == skipped
    return resumed


@pytest.mark.timeout(120)
def test_dispatcher_resumes_mid_epoch() -> None:
    ranks = run_distributed(_resume_dispatch, world_size=2, timeout=90)
    assert ranks[0] == [[4.0, 5.0], [8.0, 9.0]]
    assert ranks[1] == [[6.0, 7.0], [10.0, 11.0]]

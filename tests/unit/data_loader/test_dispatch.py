"""DataLoaderDispatcher in one process (broadcasts are no-ops): rounds, end flag, resume."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.data_loader import DataLoaderDispatcher, prepare_data_loader
from hasten.state import GradientState


def _dispatcher(length: int = 7, batch_size: int = 2, **kwargs: object) -> DataLoaderDispatcher:
    loader = DataLoader(torch.arange(float(length)), batch_size=batch_size)
    prepared = prepare_data_loader(
        loader, device=torch.device("cpu"), put_on_device=True, dispatch_batches=True, **kwargs
    )
    assert isinstance(prepared, DataLoaderDispatcher)
    return prepared


def test_yields_every_batch_and_flags_the_last() -> None:
    state = GradientState()
    dispatcher = _dispatcher()
    seen = [(b.tolist(), state.end_of_dataloader) for b in dispatcher]
    assert seen == [([0, 1], False), ([2, 3], False), ([4, 5], False), ([6], True)]
    assert dispatcher.remainder == 1
    assert len(dispatcher) == 4
    assert dispatcher.total_batch_size == 2
    assert dispatcher.total_dataset_length == 7


def test_split_batches_keeps_the_batch_size() -> None:
    dispatcher = _dispatcher(8, 4, split_batches=True)
    assert [b.tolist() for b in dispatcher] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(dispatcher) == 2 and dispatcher.total_batch_size == 4


def test_state_dict_resume() -> None:
    dispatcher = _dispatcher()
    iterator = iter(dispatcher)
    next(iterator), next(iterator)
    state = dispatcher.state_dict()
    assert state["batches_yielded"] == 2
    fresh = _dispatcher()
    fresh.load_state_dict(state)
    assert [b.tolist() for b in fresh] == [[4, 5], [6]]
    assert fresh.state_dict() == {"epoch": 1, "batches_yielded": 0}


def test_batches_of_different_shapes_in_a_round_are_explained() -> None:
    from hasten.data_loader.dispatch import _concatenate_round

    with pytest.raises(RuntimeError, match="dispatch_batches=True needs batches of the same shape"):
        _concatenate_round([torch.zeros(1, 2), torch.zeros(1, 3)])


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata
def test_stateful_dispatcher_resumes() -> None:
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata not installed")
    dispatcher = _dispatcher(use_stateful_dataloader=True)
    iterator = iter(dispatcher)
    next(iterator)
    state = dispatcher.state_dict()
    fresh = _dispatcher(use_stateful_dataloader=True)
    fresh.load_state_dict(state)
    assert [b.tolist() for b in fresh] == [[2, 3], [4, 5], [6]]

"""gather_for_metrics on one process through a real Accelerator: Accelerate's [2, 2, 1] idiom."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hasten import Accelerator
from hasten.utils import DataLoaderConfiguration


class Stream(IterableDataset[torch.Tensor]):
    def __init__(self, length: int, sized: bool) -> None:
        self.length, self.sized = length, sized

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(float(self.length)).unsqueeze(1))

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("unsized stream")
        return self.length


def _sizes(acc: Accelerator, loader: Any, batch_size: int = 2, **kwargs: Any) -> list[int]:
    """The perplexity idiom: repeat each batch's loss by the batch size, gather it for metrics."""
    sizes = []
    for batch in acc.prepare(loader):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        loss = x.float().mean()
        sizes.append(len(acc.gather_for_metrics(loss.repeat(batch_size), **kwargs)))
    return sizes


def test_repeated_loss_keeps_only_real_samples_of_last_batch() -> None:
    acc = Accelerator(cpu=True)
    loader = DataLoader(TensorDataset(torch.arange(5.0)), batch_size=2)
    assert _sizes(acc, loader) == [2, 2, 1]


def test_nested_structures_and_objects_are_cut_too() -> None:
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(5.0)), batch_size=2))
    nested, objects, forced = [], [], []
    for (x,) in loader:
        out = acc.gather_for_metrics({"a": x.repeat(2)[:2], "b": [(x.repeat(2)[:2],)]})
        nested.append((len(out["a"]), len(out["b"][0][0])))
        objects.append(len(acc.gather_for_metrics(["s", "t"])))
        forced.append(len(acc.gather_for_metrics([x[0], x[0]], use_gather_object=True)))
    assert nested == [(2, 2), (2, 2), (1, 1)]
    assert objects == [2, 2, 1]
    assert forced == [2, 2, 1]


def test_scalar_loss_is_returned_unchanged() -> None:
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(5.0)), batch_size=2))
    shapes = [acc.gather_for_metrics(x.mean()).shape for (x,) in loader]
    assert shapes == [torch.Size([])] * 3


def test_drop_last_cuts_nothing() -> None:
    acc = Accelerator(cpu=True)
    loader = DataLoader(TensorDataset(torch.arange(5.0)), batch_size=2, drop_last=True)
    assert _sizes(acc, loader) == [2, 2]


@pytest.mark.parametrize(
    ("sized", "dispatch", "expected"),
    [
        # Iterable datasets are dispatched by default: the last batch's real size is observed.
        (True, None, [2, 2, 1]),
        (False, None, [2, 2, 1]),
        # Sharded: the remainder comes from len(); an unsized stream has none (-1), nothing is cut.
        (True, False, [2, 2, 1]),
        (False, False, [2, 2, 2]),
    ],
    ids=["sized-dispatch", "unsized-dispatch", "sized-shard", "unsized-shard"],
)
def test_iterable_dataset(sized: bool, dispatch: bool | None, expected: list[int]) -> None:
    acc = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch)
    )
    assert _sizes(acc, DataLoader(Stream(5, sized), batch_size=2)) == expected


@pytest.mark.parametrize(
    "config",
    [
        DataLoaderConfiguration(even_batches=False),
        DataLoaderConfiguration(split_batches=True),
        DataLoaderConfiguration(dispatch_batches=True),
    ],
    ids=["uneven", "split", "dispatch"],
)
def test_loader_settings_keep_the_idiom(config: DataLoaderConfiguration) -> None:
    acc = Accelerator(cpu=True, dataloader_config=config)
    loader = DataLoader(TensorDataset(torch.arange(5.0)), batch_size=2)
    assert _sizes(acc, loader) == [2, 2, 1]


def test_outside_a_dataloader_nothing_is_cut() -> None:
    acc = Accelerator(cpu=True)
    assert len(acc.gather_for_metrics(torch.ones(3))) == 3

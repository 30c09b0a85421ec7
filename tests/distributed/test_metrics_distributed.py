"""gather_for_metrics on 2 gloo processes: the padding of the last round is dropped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed]


class Stream(IterableDataset[torch.Tensor]):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(float(self.length)))

    def __len__(self) -> int:
        return self.length


def _evaluate(loader: DataLoader[Any], **config: Any) -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.state._shared import reset_state
    from hasten.utils import DataLoaderConfiguration

    reset_state()
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
    sizes, values, objects, forced = [], [], [], []
    for batch in acc.prepare(loader):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        sizes.append(len(acc.gather_for_metrics(x.mean().repeat(2))))
        # Accelerate's idiom for uneven batches: pad to a common size, the cut drops the pad.
        padded = acc.pad_across_processes(x)
        values.extend(acc.gather_for_metrics({"x": [padded]})["x"][0].tolist())
        objects.extend(acc.gather_for_metrics([f"s{int(v)}" for v in x]))
        forced.extend(acc.gather_for_metrics(x.tolist(), use_gather_object=True))
    return {"sizes": sizes, "values": values, "objects": objects, "forced": forced}


def _cases() -> dict[str, dict[str, Any]]:
    five = TensorDataset(torch.arange(5.0))
    return {
        "even": _evaluate(DataLoader(five, batch_size=2)),
        "uneven": _evaluate(
            DataLoader(TensorDataset(torch.arange(7.0)), batch_size=2), even_batches=False
        ),
        "dispatch": _evaluate(DataLoader(five, batch_size=2), dispatch_batches=True),
        "split": _evaluate(
            DataLoader(TensorDataset(torch.arange(6.0)), batch_size=4), split_batches=True
        ),
        "stream": _evaluate(DataLoader(Stream(5), batch_size=2), dispatch_batches=False),
    }


@pytest.mark.timeout(120)
def test_gather_for_metrics_two_processes() -> None:
    ranks = run_distributed(_cases, world_size=2, timeout=90)
    assert ranks[0] == ranks[1]
    got = ranks[0]
    # 5 samples, 2 per process: rounds of 4 then 1 real sample (+3 padding, dropped).
    assert got["even"]["sizes"] == [4, 1]
    assert got["dispatch"]["sizes"] == [4, 1]
    # even_batches=False: 7 samples -> rounds of 4 and 3, nothing padded, nothing cut.
    assert got["uneven"]["sizes"] == [4, 3]
    # split_batches: 6 samples, global batch 4 -> 4 then 2 real.
    assert got["split"]["sizes"] == [4, 2]
    # A sized iterable dataset: its real length (5) gives the remainder.
    assert got["stream"]["sizes"] == [4, 1]
    for name, total in [("even", 5), ("dispatch", 5), ("uneven", 7), ("split", 6), ("stream", 5)]:
        case = got[name]
        assert sorted(case["values"]) == [float(v) for v in range(total)], name
        assert sorted(case["objects"]) == sorted(f"s{v}" for v in range(total)), name
        assert sorted(case["forced"]) == [float(v) for v in range(total)], name

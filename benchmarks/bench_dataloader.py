"""Prepared DataLoader iteration speed versus the raw DataLoader (and HF Accelerate if installed).

The workload is where loader overhead shows most: a small in-memory dataset, batch 32, the
default collate, single process on CPU, batches placed on the CPU device (what
``Accelerator.prepare`` does by default). Runs are interleaved; each epoch is timed in process
CPU time, and the median over epochs is reported as batches per second, as the median ratio of
back-to-back epochs to the raw loader (higher is better; the target is >= 0.98) and as the
extra time per batch. The pre-batched workload removes data loading altogether, so what is
left is each wrapper's own per-batch cost.

Run: ``.venv/bin/python benchmarks/bench_dataloader.py [--epochs 15] [--samples 32768]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from _reference import require_real_accelerate
from torch.utils.data import DataLoader, TensorDataset


def _epoch_seconds(loader: Iterable[Any]) -> float:
    # CPU time of this process (single process, no workers): far less disturbed than wall time
    # by other jobs sharing the machine.
    start = time.process_time()
    for _batch in loader:
        pass
    return time.process_time() - start


def _make_raw(dataset: TensorDataset, shuffle: bool) -> DataLoader[Any]:
    collate = _keep if isinstance(dataset, PreBatched) else None
    return DataLoader(dataset, batch_size=32, shuffle=shuffle, collate_fn=collate)


def _make_hasten(dataset: TensorDataset, shuffle: bool) -> Iterable[Any]:
    from hasten.data_loader import prepare_data_loader
    from hasten.state import PartialState

    device = PartialState(cpu=True).device
    return prepare_data_loader(_make_raw(dataset, shuffle), device=device, put_on_device=True)


def _make_accelerate(dataset: TensorDataset, shuffle: bool) -> Iterable[Any] | None:
    try:
        require_real_accelerate()
        from accelerate.data_loader import prepare_data_loader  # benchmark-only comparison
        from accelerate.state import PartialState
    except ImportError:
        return None
    device = PartialState(cpu=True).device
    return prepare_data_loader(_make_raw(dataset, shuffle), device=device, put_on_device=True)


class PreBatched(torch.utils.data.Dataset[Any]):
    """Hands back a ready batch: the loader's own overhead is all that is left to measure."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.batch = (torch.zeros(32, 64), torch.zeros(32, dtype=torch.long))

    def __len__(self) -> int:
        return self.samples

    def __getitems__(self, indices: list[int]) -> Any:
        return self.batch


def _keep(batch: Any) -> Any:
    return batch


def _run(name: str, shuffle: bool, samples: int, epochs: int) -> None:
    torch.manual_seed(0)
    dataset: Any = TensorDataset(torch.randn(samples, 64), torch.randint(0, 10, (samples,)))
    if name == "pre-batched":
        dataset = PreBatched(samples)
    makers: dict[str, Callable[[TensorDataset, bool], Iterable[Any] | None]] = {
        "raw": _make_raw,
        "hasten": _make_hasten,
        "accelerate": _make_accelerate,
    }
    loaders = {k: make(dataset, shuffle) for k, make in makers.items()}
    loaders = {k: v for k, v in loaders.items() if v is not None}
    times: dict[str, list[float]] = {k: [] for k in loaders}
    for loader in loaders.values():  # warm-up
        _epoch_seconds(loader)
    for _ in range(epochs):
        for key, loader in loaders.items():
            times[key].append(_epoch_seconds(loader))
    batches = len(loaders["raw"])  # type: ignore[arg-type]
    print(f"\n{name} ({samples} samples, batch 32, {batches} batches/epoch, median of {epochs})")
    for key, values in times.items():
        # Ratio of back-to-back epochs, then the median: robust to the machine's load drifting.
        ratio = statistics.median(r / v for r, v in zip(times["raw"], values))
        extra = statistics.median((v - r) / batches * 1e6 for r, v in zip(times["raw"], values))
        rate = batches / statistics.median(values)
        print(
            f"  {key:<11} {rate:10.0f} batches/s   ratio to raw {ratio:.3f}"
            f"   overhead {extra:+6.2f} us/batch"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--samples", type=int, default=16384)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _run("sequential", False, args.samples, args.epochs)
    _run("shuffled", True, args.samples, args.epochs)
    _run("pre-batched", False, args.samples * 4, args.epochs)


if __name__ == "__main__":
    main()

"""The data position under a change of world size: the same global batches, each sample once.

A run is saved mid-epoch at one number of processes and resumed, in new processes, at
another; the sample ids of every global step (gathered) and the final weights are compared
with an uninterrupted run at the saving world size.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed]

SAMPLES = 24
TOTAL = 10  # steps: 6 per epoch with a global batch of 4, so a save at 4 is mid-epoch 0
SAVED_AT = 4


class Ids(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i is (its id, an input that depends on it)."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.tensor([float(i) / SAMPLES, 1.0 - float(i) / SAMPLES])


def _train(
    folder: str, split: bool, steps: int, resume: bool, own_generator: bool, keep: bool = False
) -> dict[str, Any]:
    """Train global steps until ``steps`` (saving at the end unless resuming); the ledger."""
    from hasten import Accelerator
    from hasten.utils import DataLoaderConfiguration, set_seed

    set_seed(0)
    acc = Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(split_batches=split),
    )
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7) if own_generator else None
    per_process = 4 if split else 2  # global batch 4 at 2 processes either way
    loader = DataLoader(Ids(), batch_size=per_process, shuffle=True, generator=generator)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    done, ledger = 0, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if resume:
            acc.load_state(folder, keep_global_batch=keep)
            done = SAVED_AT
        while done < steps:
            for ids, x in loader:
                with acc.accumulate(model):
                    acc.backward((model(x) ** 2).mean())
                    optimizer.step()
                    optimizer.zero_grad()
                ledger.append(acc.gather(ids).tolist())
                done += int(acc.sync_gradients)  # optimizer steps
                if done == steps:
                    break
    if not resume:
        acc.save_state(folder)
    return {
        "ledger": ledger,
        "weight": [p.detach().clone() for p in model.parameters()],
        "warnings": [str(w.message) for w in caught if w.category is RuntimeWarning],
        "accumulation": acc.gradient_accumulation_steps,
    }


def _compare(
    tmp: Path, before: int, after: int, split: bool, own: bool, keep: bool = False
) -> tuple[Any, Any]:
    """(uninterrupted at ``before``, saved at ``before`` and resumed at ``after``)."""
    full = run_distributed(
        _train, str(tmp / "full"), split, TOTAL, False, own, keep, world_size=before, timeout=90
    )[0]
    folder = str(tmp / "ckpt")
    first = run_distributed(
        _train, folder, split, SAVED_AT, False, own, keep, world_size=before, timeout=90
    )[0]
    rest = run_distributed(
        _train, folder, split, TOTAL, True, own, keep, world_size=after, timeout=90
    )
    resumed = dict(rest[0], ledger=first["ledger"] + rest[0]["ledger"])
    resumed["warnings"] = [w for r in rest for w in r["warnings"]]
    return full, resumed


def _same_weights(full: dict[str, Any], resumed: dict[str, Any]) -> None:
    for a, b in zip(full["weight"], resumed["weight"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # float reduction order


def _each_sample_once_per_epoch(ledger: list[list[int]]) -> None:
    flat = [i for step in ledger for i in step]
    for epoch in range(len(flat) // SAMPLES):
        assert sorted(flat[epoch * SAMPLES : (epoch + 1) * SAMPLES]) == list(range(SAMPLES))


@pytest.mark.timeout(240)
def test_split_batches_two_to_one_trains_the_same_global_batches(tmp_path: Path) -> None:
    full, resumed = _compare(tmp_path, 2, 1, split=True, own=False)
    assert [sorted(s) for s in resumed["ledger"]] == [sorted(s) for s in full["ledger"]]
    _each_sample_once_per_epoch(full["ledger"])
    _same_weights(full, resumed)
    # fewer processes: the RNG streams of the process that is gone are named, once
    assert sum("saved by 2 processes and is loaded by 1" in w for w in resumed["warnings"]) == 1


@pytest.mark.timeout(240)
def test_split_batches_one_to_two_with_a_loader_generator(tmp_path: Path) -> None:
    full, resumed = _compare(tmp_path, 1, 2, split=True, own=True)
    assert [sorted(s) for s in resumed["ledger"]] == [sorted(s) for s in full["ledger"]]
    _same_weights(full, resumed)
    assert any("process 1 has no saved RNG states" in w for w in resumed["warnings"])


@pytest.mark.timeout(240)
def test_one_to_two_from_the_global_generator_keeps_the_epoch_and_warns(tmp_path: Path) -> None:
    full, resumed = _compare(tmp_path, 1, 2, split=True, own=False)
    epoch = SAMPLES // 4
    assert [sorted(s) for s in resumed["ledger"][:epoch]] == [
        sorted(s) for s in full["ledger"][:epoch]
    ]
    assert any("later epochs are shuffled differently" in w for w in resumed["warnings"])


@pytest.mark.timeout(240)
def test_per_process_batches_two_to_one_continue_the_order_and_warn(tmp_path: Path) -> None:
    full, resumed = _compare(tmp_path, 2, 1, split=False, own=False)
    flat = [i for step in resumed["ledger"] for i in step]
    assert flat == [i for step in full["ledger"] for i in step][: len(flat)]
    _each_sample_once_per_epoch(resumed["ledger"])
    assert any("the global batch changes (2 to 1" in w for w in resumed["warnings"])


@pytest.mark.timeout(240)
def test_keep_global_batch_doubles_accumulation_on_fewer_processes(tmp_path: Path) -> None:
    full, resumed = _compare(tmp_path, 2, 1, split=False, own=False, keep=True)
    assert resumed["accumulation"] == 2  # 2 processes x 1 step = 1 process x 2 steps
    flat = [i for step in resumed["ledger"] for i in step]
    assert flat == [i for step in full["ledger"] for i in step]  # same order, each once
    _each_sample_once_per_epoch(resumed["ledger"])
    _same_weights(full, resumed)
    assert not any("global batch changes" in w for w in resumed["warnings"])


def _load_on_two(folder: str) -> str:
    try:
        _train(folder, False, TOTAL, True, False, True)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(240)
def test_keep_global_batch_that_more_processes_cannot_divide_is_refused(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    run_distributed(_train, folder, False, SAVED_AT, False, False, True, world_size=1, timeout=90)
    errors = run_distributed(_load_on_two, folder, world_size=2, timeout=90)
    for error in errors:  # names both numbers and the way out
        assert "global batch is 1 per-process batches" in error
        assert "which 2 processes cannot divide" in error
        assert "gradient_accumulation_steps" in error


def _split_three(folder: str, resume: bool) -> str:
    """Save a split-batches run whose global batch is 3, or try to resume it; the error."""
    from hasten import Accelerator
    from hasten.utils import DataLoaderConfiguration

    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    model = acc.prepare(torch.nn.Linear(2, 1))
    try:
        loader = acc.prepare(DataLoader(Ids(), batch_size=3))
    except ValueError as exc:
        return str(exc)
    next(iter(loader))
    if not resume:
        acc.save_state(folder)
    del model
    return "no error"


@pytest.mark.timeout(240)
def test_a_global_batch_the_new_processes_cannot_divide_is_refused(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    assert run_distributed(_split_three, folder, False, world_size=1, timeout=90) == ["no error"]
    for error in run_distributed(_split_three, folder, True, world_size=2, timeout=90):
        assert "batch size (3) needs to be a round multiple of the number of processes (2)" in error
        assert "Use a batch size divisible by 2" in error

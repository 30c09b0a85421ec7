"""Exact resume includes the random draws inside the data pipeline, with and without workers.

A dataset with random transforms (torch, python and numpy draws in ``__getitem__``) and a
collator that draws masks at random are trained for two epochs; a run saved mid-epoch and
resumed in a new process must give bit-identical batches and final weights.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

STEPS = 10  # 2 epochs of 6 batches


class RandomCrops(Dataset[torch.Tensor]):
    """A 'crop' at a random offset, flipped at random, with a little numpy jitter."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        row = torch.arange(8.0) + 10 * i
        offset = int(torch.randint(0, 4, ()).item())
        crop = row[offset : offset + 4]
        if random.random() < 0.5:
            crop = crop.flip(0)
        return crop + float(np.random.uniform(0, 0.01))


def mask_collate(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Masked-LM style: mask 30% of positions (torch draw), keep one at random (python draw)."""
    batch = torch.stack(samples)
    mask = torch.bernoulli(torch.full(batch.shape, 0.3)).bool()
    mask[:, random.randrange(batch.shape[1])] = False
    return {"inputs": batch.masked_fill(mask, 0.0), "mask": mask}


def _in_new_process(folder: str, *args: Any) -> dict[str, Any]:
    """Run `_train` in a fresh forked process (not a daemon: it may start DataLoader workers)."""
    out = Path(folder + ".result")

    def child() -> None:
        from hasten.state._shared import reset_state

        try:
            reset_state()
            torch.save(("ok", _train(folder, *args)), out)
        except BaseException:  # noqa: BLE001 - reported to the test
            torch.save(("error", traceback.format_exc()), out)

    proc = mp.get_context("fork").Process(target=child)
    proc.start()
    proc.join(timeout=120)
    if proc.is_alive():
        proc.kill()
        raise AssertionError("the training process did not finish in 120 s")
    status, payload = torch.load(out, weights_only=False)
    out.unlink()
    assert status == "ok", payload
    return payload


def _train(folder: str, workers: int, stop: int, resume: int) -> dict[str, Any]:
    """Train from batch ``resume`` (0: from scratch, else load the checkpoint) to ``stop``."""
    from hasten import Accelerator
    from hasten.utils import set_seed

    set_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.2), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        RandomCrops(), batch_size=2, shuffle=True, num_workers=workers, collate_fn=mask_collate
    )
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    done = 0
    if resume:
        acc.load_state(folder)
        done = resume
    seen: list[torch.Tensor] = []
    while done < stop:
        for batch in loader:
            loss = model(batch["inputs"] / 100).pow(2).mean()
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen.append(torch.cat([batch["inputs"], batch["mask"].float()], 1))
            done += 1
            if done == stop:
                break
    if not resume:
        acc.save_state(folder)
    return {"seen": seen, "weights": [p.detach().clone() for p in model.parameters()]}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("saved_at", [3, 8])  # mid-epoch 0 and mid-epoch 1
def test_random_transforms_and_collator_resume_bit_identical(
    tmp_path: Path, workers: int, saved_at: int
) -> None:
    full = _in_new_process(str(tmp_path / "full"), workers, STEPS, 0)
    first = _in_new_process(str(tmp_path / "ck"), workers, saved_at, 0)
    rest = _in_new_process(str(tmp_path / "ck"), workers, STEPS, saved_at)
    seen = first["seen"] + rest["seen"]
    assert len(seen) == len(full["seen"]) == STEPS
    for step, (a, b) in enumerate(zip(full["seen"], seen)):
        assert torch.equal(a, b), f"batch {step} differs"
    for a, b in zip(full["weights"], rest["weights"]):
        assert torch.equal(a, b)

"""docs/differences.md's recipe: opting out of exact mid-epoch resume gives Accelerate's behaviour.

hasten's checkpoint restores the loader's epoch and position, its epoch-start shuffle and the
gradients accumulated mid-cycle; Accelerate's restores none of these. The recipe (forget the
loader position, drop the gradients, restart the accumulation count) must give a fresh shuffle
and a clean accumulation cycle, while the default resumes the interrupted epoch exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from hasten import Accelerator
from hasten.data_loader import skip_first_batches
from hasten.state._shared import reset_state
from hasten.utils import set_seed


def _setup() -> tuple[Accelerator, Any, Any, Any]:
    reset_state()
    set_seed(0)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.arange(16.0).unsqueeze(1), batch_size=2, shuffle=True)
    return acc, *acc.prepare(model, optimizer, loader)


def _train(acc: Accelerator, model: Any, optimizer: Any, batches: Any, count: int) -> list[Any]:
    seen = []
    for batch in batches:
        with acc.accumulate(model):
            acc.backward(model(batch).sum())
            optimizer.step()
            optimizer.zero_grad()
        seen.append(batch.flatten().tolist())
        if len(seen) == count:
            break
    return seen


def _interrupted(folder: Path) -> list[Any]:
    """Train 3 batches (mid-accumulation), save, and return what the epoch would still yield."""
    acc, model, optimizer, loader = _setup()
    batches = iter(loader)
    _train(acc, model, optimizer, batches, 3)
    acc.save_state(str(folder))
    return _train(acc, model, optimizer, batches, 99)


def test_default_resume_replays_the_interrupted_epoch(tmp_path: Path) -> None:
    rest = _interrupted(tmp_path / "ckpt")
    acc, model, optimizer, loader = _setup()
    acc.load_state(str(tmp_path / "ckpt"))
    assert model.weight.grad is not None  # the half-accumulated gradients came back
    assert acc.step == 3
    assert _train(acc, model, optimizer, skip_first_batches(loader, 3), 99) == rest


def test_accelerate_recipe_forgets_position_gradients_and_count(tmp_path: Path) -> None:
    rest = _interrupted(tmp_path / "ckpt")
    acc, model, optimizer, loader = _setup()
    acc.load_state(str(tmp_path / "ckpt"))
    # The recipe of docs/differences.md:
    loader.load_state_dict({"epoch": 0, "batches_yielded": 0})
    optimizer.zero_grad(set_to_none=True)
    acc.step = 0
    assert model.weight.grad is None
    resumed = _train(acc, model, optimizer, skip_first_batches(loader, 3), 99)
    # Like Accelerate: 5 batches, but from a new shuffle drawn from the restored RNG.
    assert len(resumed) == len(rest) == 5
    assert resumed != rest

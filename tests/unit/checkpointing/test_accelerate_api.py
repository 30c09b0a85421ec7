"""Accelerate's checkpointing functions (positional lists, process_index) over hasten's checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hasten.checkpointing import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)


def _setup(
    seed: int,
) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scheduler.step()
    return model, optimizer, scheduler


def test_save_then_load_accelerator_state_round_trips(tmp_path: Path) -> None:
    model, optimizer, scheduler = _setup(0)
    folder = save_accelerator_state(
        tmp_path / "ckpt", [model.state_dict()], [optimizer], [scheduler], [], 0, step=7
    )
    assert folder == (tmp_path / "ckpt").absolute() and (folder / "model.safetensors").is_file()
    other, other_opt, other_sched = _setup(1)
    attributes = load_accelerator_state(folder, [other], [other_opt], [other_sched], [], 0)
    assert attributes == {"step": 7}
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    assert other_sched.state_dict() == scheduler.state_dict()
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(other_opt.state_dict()["state"][0]["momentum_buffer"], momentum)


def test_load_accelerator_state_bad_input(tmp_path: Path) -> None:
    model, optimizer, scheduler = _setup(0)
    folder = save_accelerator_state(tmp_path / "c", [model.state_dict()], [], [], [], 0, 1)
    with pytest.raises(ValueError, match="process_index=1 but this is process 0"):
        load_accelerator_state(folder, [model], [], [], [], 1)
    with pytest.raises(ValueError, match="process_index=3 but this is process 0"):
        save_accelerator_state(tmp_path / "d", [model.state_dict()], [], [], [], 3, 1)
    with pytest.raises(
        TypeError, match=r"^Unsupported optimizer map location passed, .* \(hasten: got 'gpu'\.\)"
    ):
        load_accelerator_state(folder, [model], [], [], [], 0, map_location="gpu")
    with pytest.raises(TypeError, match="load_kwargs .*'mmap'"):
        load_accelerator_state(folder, [model], [], [], [], 0, load_kwargs={"mmap": True})
    with pytest.raises(TypeError, match=r"Unsupported model loading options \['assign'\]"):
        load_accelerator_state(folder, [model], [], [], [], 0, assign=True)
    assert load_accelerator_state(
        folder, [model], [], [], [], 0, map_location="on_device", load_kwargs={"weights_only": True}
    ) == {"step": 1}


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def test_custom_state_round_trips_under_accelerate_file_name(tmp_path: Path) -> None:
    counter = _Counter()
    counter.count = 5
    save_custom_state(counter, str(tmp_path), index=2)
    assert (tmp_path / "custom_checkpoint_2.pkl").is_file()
    restored = _Counter()
    load_custom_state(restored, str(tmp_path), index=2)
    assert restored.count == 5
    with pytest.raises(FileNotFoundError):
        load_custom_state(restored, str(tmp_path), index=3)

"""`save` writes once per job across processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from _support.distributed import run_distributed
from hasten.checkpointing.storage.io import load

pytestmark = pytest.mark.distributed


def _save_from_every_rank(folder: str) -> list[str]:
    from hasten.checkpointing.storage.io import save
    from hasten.state import PartialState

    state = PartialState()
    save({"rank": torch.tensor(state.process_index)}, Path(folder) / "x.bin")
    state.wait_for_everyone()
    return sorted(os.listdir(folder))


@pytest.mark.timeout(90)
def test_save_writes_only_on_main_process(tmp_path: Path) -> None:
    results = run_distributed(_save_from_every_rank, str(tmp_path), world_size=2, timeout=60)
    assert results[0] == results[1] == ["x.bin"]
    assert int(load(tmp_path / "x.bin")["rank"]) == 0


def _async_save_then_step(folder: str) -> bool:
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step() -> None:
        data = torch.randn(4, 32) + accelerator.process_index
        accelerator.backward(model(data).square().mean())
        optimizer.step()
        optimizer.zero_grad()

    step()
    before = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator.save_state(folder, async_save=True)
    step()  # held until this process's optimizer state is copied, then changes it
    accelerator.load_state(folder)  # waits for the pending save on every process
    after = optimizer.state_dict()["state"][0]
    same_state = all(torch.equal(after[k], v) for k, v in before.items())
    same_weights = all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    return same_state and same_weights


@pytest.mark.timeout(90)
def test_async_save_on_two_processes_holds_the_state_of_the_call(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    assert run_distributed(_async_save_then_step, folder, world_size=2, timeout=60) == [True, True]
    assert (tmp_path / "ckpt" / "hasten_manifest.json").is_file()

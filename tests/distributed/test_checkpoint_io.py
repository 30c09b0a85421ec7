"""`save` writes once per job across processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from _support.distributed import run_distributed
from hasten.checkpointing.io import load

pytestmark = pytest.mark.distributed


def _save_from_every_rank(folder: str) -> list[str]:
    from hasten.checkpointing.io import save
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

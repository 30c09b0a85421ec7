"""Sharded checkpoints: 2 processes each write their part; 1 process loads full tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed
from hasten.checkpointing.dcp_folders import load_sharded_state
from hasten.checkpointing.storage.manifest import MANIFEST_NAME

pytestmark = pytest.mark.distributed


def _expected() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return {
        "weight": torch.randn(8, 4, generator=generator),
        "bias": torch.randn(4, generator=generator),
        "step": torch.tensor(11),
    }


def _save_sharded(folder: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from hasten.checkpointing.dcp_folders import full_tensor, save_sharded_state
    from hasten.state import PartialState

    state = PartialState()
    mesh = init_device_mesh("cpu", (state.num_processes,))
    expected = _expected()
    weight = distribute_tensor(expected["weight"], mesh, [Shard(0)])  # each rank holds 4 rows
    state_dict = {
        "model": {"weight": weight, "bias": expected["bias"]},
        "optimizer": {"step": expected["step"]},
    }
    final = save_sharded_state(state_dict, Path(folder) / "sharded")
    return {
        "local_rows": weight.to_local().shape[0],
        "files": sorted(p.name for p in final.iterdir()),
        "full": torch.equal(full_tensor(weight), expected["weight"]),
    }


@pytest.mark.timeout(90)
def test_two_processes_save_one_loads(tmp_path: Path) -> None:
    results = run_distributed(_save_sharded, str(tmp_path), world_size=2, timeout=60)
    assert results[0]["local_rows"] == results[1]["local_rows"] == 4
    # DCP's files, and the manifest listing them (written last, by the main process)
    assert results[0]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", MANIFEST_NAME]
    assert results[0]["full"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sharded"]  # no staging left
    # One process, full tensors: DCP reassembles the two halves.
    template = {
        "model": {"weight": torch.zeros(8, 4), "bias": torch.zeros(4)},
        "optimizer": {"step": torch.tensor(0)},
    }
    loaded = load_sharded_state(template, tmp_path / "sharded")
    expected = _expected()
    assert torch.equal(loaded["model"]["weight"], expected["weight"])
    assert torch.equal(loaded["model"]["bias"], expected["bias"])
    assert int(loaded["optimizer"]["step"]) == 11


def test_missing_sharded_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"No complete sharded checkpoint.*\.metadata"):
        load_sharded_state({}, tmp_path)


def test_one_process_round_trip_is_published_atomically(tmp_path: Path) -> None:
    from hasten.checkpointing.dcp_folders import is_sharded_checkpoint, save_sharded_state
    from hasten.state._shared import reset_state

    reset_state()
    state = {"w": torch.arange(6.0).reshape(2, 3)}
    final = save_sharded_state(state, tmp_path / "one")
    assert is_sharded_checkpoint(final)
    assert not is_sharded_checkpoint(tmp_path)
    loaded = load_sharded_state({"w": torch.zeros(2, 3)}, final)
    assert torch.equal(loaded["w"], state["w"])


def _save_with_groups(folder: str) -> dict[str, Any]:
    import torch.distributed as dist

    from hasten.checkpointing.dcp_folders import save_sharded_state
    from hasten.state import PartialState

    state = PartialState()
    alone = [dist.new_group([rank]) for rank in range(state.num_processes)]
    state_dict = {"w": torch.full((2,), float(state.process_index))}
    try:
        save_sharded_state(
            state_dict, Path(folder) / "subgroup", process_group=alone[state.process_index]
        )
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    whole = save_sharded_state(state_dict, Path(folder) / "whole", process_group=dist.group.WORLD)
    return {"refused": refused, "whole": sorted(p.name for p in whole.iterdir())}


@pytest.mark.timeout(90)
def test_a_subgroup_save_is_refused_before_anything_waits(tmp_path: Path) -> None:
    results = run_distributed(_save_with_groups, str(tmp_path), world_size=2, timeout=60)
    for result in results:
        # each process is refused on its own, at once: no collective waits on the other
        assert "process_group has 1 of its 2 processes" in result["refused"]
        assert "process_group=None" in result["refused"]
        assert MANIFEST_NAME in result["whole"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whole"]  # the refused save wrote nothing

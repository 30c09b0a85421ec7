"""``hasten merge-weights``: a checkpoint 2 processes wrote in shards -> one safetensors file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed


def _expected() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return {"0.weight": torch.randn(6, 4, generator=generator), "0.bias": torch.randn(6)}


def _save(folder: str, with_optimizer: bool) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from hasten.checkpointing.dcp_folders import save_sharded_state
    from hasten.state import PartialState

    state = PartialState()
    mesh = init_device_mesh("cpu", (state.num_processes,))
    expected = _expected()
    weight = distribute_tensor(expected["0.weight"], mesh, [Shard(0)])
    state_dict: dict[str, Any] = {"model": {"0.weight": weight, "0.bias": expected["0.bias"]}}
    if with_optimizer:
        state_dict["optimizer"] = {"step": torch.tensor(3)}
    save_sharded_state(state_dict, Path(folder) / "sharded")
    return int(weight.to_local().shape[0])


@pytest.mark.timeout(120)
def test_merge_weights_cli_writes_one_loadable_safetensors_file(tmp_path: Path) -> None:
    assert run_distributed(_save, str(tmp_path), False, world_size=2, timeout=60) == [3, 3]
    out = subprocess.run(
        [sys.executable, "-m", "hasten.commands.cli", "merge-weights"]
        + [str(tmp_path / "sharded"), str(tmp_path / "merged"), "--remove_checkpoint_dir"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    target = tmp_path / "merged" / "model.safetensors"
    assert f"Merged weights saved to {target}" in out.stdout
    merged = load_file(target)  # no process group in this process
    expected = _expected()
    assert sorted(merged) == ["0.bias", "0.weight"]  # the single "model" root is dropped
    assert all(torch.equal(merged[key], expected[key]) for key in expected)
    assert not (tmp_path / "sharded").exists()
    model = torch.nn.Sequential(torch.nn.Linear(4, 6))
    model.load_state_dict(merged)  # loads straight into the module


@pytest.mark.timeout(120)
def test_merge_keeps_prefixes_with_several_roots_and_writes_pickles_on_request(
    tmp_path: Path,
) -> None:
    from hasten.utils import merge_fsdp_weights  # Accelerate's name for merge-weights

    run_distributed(_save, str(tmp_path), True, world_size=2, timeout=60)
    merge_fsdp_weights(str(tmp_path / "sharded"), str(tmp_path / "merged"), False)
    target = tmp_path / "merged" / "pytorch_model.bin"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
    merged = torch.load(target, weights_only=True)
    assert sorted(merged) == ["model.0.bias", "model.0.weight", "optimizer.step"]
    assert torch.equal(merged["model.0.weight"], _expected()["0.weight"])
    assert (tmp_path / "sharded").is_dir()  # kept unless asked


def test_merge_refuses_non_checkpoints_and_outputs_inside_a_removed_folder(tmp_path: Path) -> None:
    from hasten.checkpointing.merge import merge_sharded_checkpoint

    with pytest.raises(FileNotFoundError, match=r"not a complete sharded checkpoint"):
        merge_sharded_checkpoint(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="inside checkpoint_dir"):
        merge_sharded_checkpoint(tmp_path, tmp_path / "out", remove_checkpoint_dir=True)


def _save_then_merge_everywhere(folder: str) -> list[str]:
    # Accelerate's test_merge_weights: every process merges, then reads the merged file at once
    from hasten.checkpointing.fsdp_utils import merge_fsdp_weights
    from hasten.commands.merge import merge_command, merge_command_parser

    _save(folder, False)
    merge_fsdp_weights(str(Path(folder) / "sharded"), str(Path(folder) / "a"))
    first = sorted(load_file(Path(folder) / "a" / "model.safetensors"))
    args = merge_command_parser().parse_args(
        [str(Path(folder) / "sharded"), str(Path(folder) / "b")]
    )
    merge_command(args)
    return first + sorted(load_file(Path(folder) / "b" / "model.safetensors"))


@pytest.mark.timeout(120)
def test_merge_called_by_every_process_merges_once_and_waits(tmp_path: Path) -> None:
    for keys in run_distributed(
        _save_then_merge_everywhere, str(tmp_path), world_size=2, timeout=90
    ):
        assert keys == ["0.bias", "0.weight", "0.bias", "0.weight"]

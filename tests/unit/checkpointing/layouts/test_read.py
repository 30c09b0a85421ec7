"""The disk decides the load: `formats_on_disk` and `read_from_disk` on real folders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hasten.checkpointing.layouts.base import CheckpointContents, LayoutLoad
from hasten.checkpointing.layouts.factory import default_layout
from hasten.checkpointing.layouts.read import Format, formats_on_disk
from hasten.checkpointing.state import load_contents, save_contents
from hasten.checkpointing.storage.reader import CheckpointReader
from hasten.core.errors import CheckpointNotFoundError


def test_dcp_part_folders_are_read_as_dcp(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    (tmp_path / "optimizer_0").mkdir()
    disk = formats_on_disk(tmp_path, 1, 1)
    assert disk.models == (Format.DCP,) and disk.optimizers == (Format.DCP,)


def test_whole_files_are_read_by_their_format(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "pytorch_model_1.bin").write_bytes(b"")
    (tmp_path / "optimizer.bin").write_bytes(b"")
    disk = formats_on_disk(tmp_path, 2, 1)
    assert disk.models == (Format.SAFETENSORS, Format.PICKLE)
    assert disk.optimizers == (Format.PICKLE,)


def test_a_dcp_part_wins_over_a_stray_whole_file(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert formats_on_disk(tmp_path, 1, 0).models == (Format.DCP,)


def test_an_engine_folder_is_recognised(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model").mkdir()
    assert formats_on_disk(tmp_path, 1, 0).models == (Format.ENGINE,)


def test_nothing_readable_names_every_format_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointNotFoundError) as info:
        formats_on_disk(tmp_path, 2, 0)
    message = str(info.value)
    assert "no readable model 1" in message
    for name in ("model_1.safetensors", "pytorch_model_1.bin", "pytorch_model_fsdp_1/"):
        assert name in message


def test_an_engine_folder_without_the_engine_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model").mkdir()
    (tmp_path / "pytorch_model" / "mp_rank_00_model_states.pt").write_bytes(b"")
    contents = CheckpointContents(models=[nn.Linear(2, 2)])
    with CheckpointReader(tmp_path, None) as files:
        with pytest.raises(ValueError, match="written by an engine"):
            default_layout().load(LayoutLoad(files, contents))


def test_whole_files_round_trip_through_the_reader(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    folder = save_contents(tmp_path / "c", CheckpointContents(model_states=[model.state_dict()]))
    assert isinstance(folder, Path)
    assert formats_on_disk(folder, 1, 0).models == (Format.SAFETENSORS,)
    fresh = nn.Linear(3, 2)
    load_contents(folder, CheckpointContents(models=[fresh]))
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)

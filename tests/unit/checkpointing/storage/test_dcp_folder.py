"""A lone DCP folder (``save_sharded_state``, the FSDP helpers' sharded folders) on one process:
written crash-safely with a manifest, verified when loaded; a folder without one still loads."""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.checkpointing.dcp_folders import load_sharded_state, save_sharded_state
from hasten.checkpointing.storage.manifest import MANIFEST_NAME, CorruptCheckpointError
from hasten.state._shared import reset_state


def _state(seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"weight": torch.randn(64, 32, generator=generator), "bias": torch.zeros(32)},
        "optimizer": {"step": torch.tensor(seed), "lr": 0.5},
    }


def _template() -> dict[str, Any]:
    return {
        "model": {"weight": torch.zeros(64, 32), "bias": torch.zeros(32)},
        "optimizer": {"step": torch.tensor(0), "lr": 0.0},
    }


def _same(loaded: dict[str, Any], seed: int) -> bool:
    expected = _state(seed)
    return (
        torch.equal(loaded["model"]["weight"], expected["model"]["weight"])
        and torch.equal(loaded["model"]["bias"], expected["model"]["bias"])
        and int(loaded["optimizer"]["step"]) == seed
        and loaded["optimizer"]["lr"] == 0.5
    )


def test_a_sharded_folder_lists_its_files_in_a_manifest_and_a_damaged_one_is_refused(
    tmp_path: Path,
) -> None:
    reset_state()
    final = save_sharded_state(_state(1), tmp_path / "ckpt")
    manifest = json.loads((final / MANIFEST_NAME).read_text())
    on_disk = sorted(p.name for p in final.iterdir() if p.name != MANIFEST_NAME)
    assert [f["name"] for f in manifest["files"]] == on_disk == [".metadata", "__0_0.distcp"]
    assert _same(load_sharded_state(_template(), final), 1)
    # a flipped byte in the shard: refused, naming the file, before the template is filled
    shard = final / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    template = _template()
    with pytest.raises(CorruptCheckpointError, match=r"__0_0\.distcp is corrupted: block"):
        load_sharded_state(template, final)
    assert not template["model"]["weight"].any()
    # a DCP folder another tool wrote (no manifest) loads through the restricted readers alone
    import torch.distributed.checkpoint as dcp

    plain = tmp_path / "plain"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(_state(2), checkpoint_id=plain, no_dist=True)
    assert _same(load_sharded_state(_template(), plain), 2)


def _save_until_killed(folder: Path, ready: int) -> None:
    """The child: a second save of ``folder`` that stops (to be killed) just before its rename."""
    from hasten.checkpointing.storage import paths

    torch.set_num_threads(1)  # the parent's OpenMP pool does not survive fork
    reset_state()

    def stop_before_publishing(staging: Path, final: Path) -> None:
        os.write(ready, b"1")
        time.sleep(60)

    paths.publish = stop_before_publishing  # type: ignore[assignment]
    save_sharded_state(_state(2), folder)


def test_a_kill_mid_save_leaves_the_previous_folder_whole(tmp_path: Path) -> None:
    reset_state()
    folder = tmp_path / "ckpt"
    save_sharded_state(_state(1), folder)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns normally
        try:
            os.close(read_end)
            _save_until_killed(folder, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        assert ready.read(1) == b"1", "the child failed before publishing: see its error above"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    # every shard and the manifest of the second save were written, but only into its staging
    staged = list(tmp_path.glob(".ckpt.*.partial"))
    assert len(staged) == 1 and (staged[0] / MANIFEST_NAME).is_file()
    assert _same(load_sharded_state(_template(), folder), 1)  # the first save, whole
    save_sharded_state(_state(3), folder)  # the next save publishes and clears what was left
    assert list(tmp_path.glob("*.partial")) == []
    assert _same(load_sharded_state(_template(), folder), 3)

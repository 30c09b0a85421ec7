"""What the processes agree on about a save: who shares which folder, what is missing where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hasten.checkpointing.state import CheckpointContents, load_contents, save_contents
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.agreement import (
    CLAIM_PREFIX,
    Folders,
    Report,
    SaveAgreement,
    missing_files,
    next_token,
)
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, read_manifest, write_bytes
from hasten.core.errors import CheckpointNotFoundError


def _report(rank: int, owner: int, error: str | None = None) -> Report:
    return Report(rank, f"host{rank}", f"/data/{rank}", owner, 1, (), (), error)


def test_owner_follows_a_claim_seen_late_to_the_lowest_rank() -> None:
    # rank 2 saw rank 1's claim but not rank 0's; rank 1 saw rank 0's: one folder
    folders = Folders((_report(0, 0), _report(1, 0), _report(2, 1), _report(3, 3)))
    assert [folders.owner(r) for r in range(4)] == [0, 0, 0, 3]
    assert folders.members(0) == [0, 1, 2] and folders.members(3) == [3]
    assert not folders.one_folder
    assert Folders((_report(0, 0), _report(1, 0))).one_folder


def test_failures_name_each_failed_process_and_its_folder() -> None:
    folders = Folders((_report(0, 0), _report(1, 1, "disk full")))
    assert folders.failures() == (
        "Process 1 could not write its part of /data/1 (on host1): disk full"
    )
    assert Folders((_report(0, 0),)).failures() is None


def test_tokens_differ_per_save_and_name_the_staging_folder(tmp_path: Path) -> None:
    first, second = next_token(), next_token()
    assert first != second and first[:8] == second[:8]  # one session, counted saves
    staging = paths.staging_path(tmp_path / "ckpt", first)
    assert staging.name == f".ckpt.{first}.partial"
    assert paths.staging_path(tmp_path / "ckpt").name == ".ckpt.partial"


def test_claims_and_the_shared_files_lock(tmp_path: Path) -> None:
    staging = tmp_path / "deep" / ".ckpt.x.partial"
    one = SaveAgreement("x", 0, 2, staging, tmp_path / "deep" / "ckpt")
    two = SaveAgreement("x", 1, 2, staging, tmp_path / "deep" / "ckpt")
    one.claim()
    two.claim()
    assert sorted(p.name for p in staging.iterdir()) == [f"{CLAIM_PREFIX}0", f"{CLAIM_PREFIX}1"]
    assert one.take_shared_files() and not two.take_shared_files()  # only one writer per folder
    report = two.agree(None, [], ["random_states_1.pkl"], None)
    assert report.reports[0].owner == 0 and report.reports[0].claims == 2
    one.remove_claims([0, 1])
    assert list(staging.iterdir()) == []


def test_remove_stale_staging_keeps_other_names(tmp_path: Path) -> None:
    for name in (".ckpt.partial", ".ckpt.ab12cd341.partial", ".ckpt_1.partial", ".ckpt.old"):
        (tmp_path / name).mkdir()
    paths.remove_stale_staging(tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.old", ".ckpt_1.partial"]


def _processes() -> list[dict[str, object]]:
    return [
        {
            "rank": 0,
            "host": "a",
            "folder": "/a/ckpt",
            "shared": ["model.safetensors", "optimizer.bin"],
            "own": ["random_states_0.pkl"],
        },
        {"rank": 1, "host": "b", "folder": "/b/ckpt", "shared": [], "own": ["random_states_1.pkl"]},
    ]


def test_missing_files_say_what_and_where() -> None:
    manifest = {"files": {"random_states_1.pkl": None}, "processes": _processes()}
    message = missing_files(Path("/b/ckpt"), manifest, 1)
    assert message is not None
    assert message.startswith("Process 1 cannot load /b/ckpt")
    assert "model.safetensors (written by process 0 on a into /a/ckpt)" in message
    assert "optimizer.bin (written by process 0 on a into /a/ckpt)" in message
    assert "random_states_0.pkl" not in message  # process 1 does not need it
    assert missing_files(Path("/b/ckpt"), {"files": {}}, 1) is None  # one shared folder
    full = {"files": dict.fromkeys(["model.safetensors", "optimizer.bin", "random_states_0.pkl"])}
    assert missing_files(Path("/a/ckpt"), {**full, "processes": _processes()}, 0) is None


def _part(folder: Path, owner: int, name: str, save: str = "s1") -> None:
    record = write_bytes(folder, name, name.encode())
    payload = {
        "format": 2,
        "checksum": "xxh3_64",
        "block_bytes": 16 << 20,
        "files": [record.to_json()],
        "save": save,
        "processes": _processes(),
    }
    manifest = "hasten_manifest.json" if owner == 0 else f"hasten_manifest_{owner}.json"
    (folder / manifest).write_text(json.dumps(payload))


def test_folders_copied_together_read_as_one_checkpoint(tmp_path: Path) -> None:
    _part(tmp_path, 0, "model.safetensors")
    _part(tmp_path, 1, "random_states_1.pkl")
    assert sorted(read_manifest(tmp_path)["files"]) == ["model.safetensors", "random_states_1.pkl"]
    only_part = tmp_path / "only"
    only_part.mkdir()
    _part(only_part, 1, "random_states_1.pkl")  # a non-main folder on its own is complete
    assert list(read_manifest(only_part)["files"]) == ["random_states_1.pkl"]


def test_folders_of_two_saves_copied_together_are_refused(tmp_path: Path) -> None:
    _part(tmp_path, 0, "model.safetensors", save="s1")
    _part(tmp_path, 1, "random_states_1.pkl", save="s2")
    with pytest.raises(CorruptCheckpointError, match="belongs to another save"):
        read_manifest(tmp_path)


def test_a_missing_file_of_another_folder_is_named_on_load(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    folder = save_contents(tmp_path / "ckpt", CheckpointContents(model_states=[model.state_dict()]))
    assert isinstance(folder, Path)
    manifest_path = folder / "hasten_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    # as if process 1 had written the weights into a folder of its own
    manifest["processes"] = [
        {"rank": 0, "host": "a", "folder": str(folder), "shared": [], "own": []},
        {"rank": 1, "host": "b", "folder": "/b/ckpt", "shared": ["extra.bin"], "own": []},
    ]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointNotFoundError, match=r"extra.bin \(written by process 1 on b"):
        load_contents(folder, CheckpointContents(models=[model]))

"""Checkpoint layout, manifest verification, tied-weight dedup and zero-copy safetensors reads."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hasten.checkpointing.rng import capture_rng_state, restore_rng_state
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    read_manifest,
    write_bytes,
    write_manifest,
)
from hasten.checkpointing.storage.reader import read_verified
from hasten.checkpointing.storage.tensors import (
    dedupe_shared_tensors,
    safetensors_bytes,
    tensors_from_safetensors,
)


def test_file_names_follow_accelerate_layout() -> None:
    assert paths.model_file(0, True) == "model.safetensors"
    assert paths.model_file(2, True) == "model_2.safetensors"
    assert paths.model_file(0, False) == "pytorch_model.bin"
    assert paths.model_file(1, False) == "pytorch_model_1.bin"
    assert paths.optimizer_file(0) == "optimizer.bin"
    assert paths.optimizer_file(1) == "optimizer_1.bin"
    assert paths.scheduler_file(0) == "scheduler.bin"
    assert paths.sampler_file(1) == "sampler_1.bin"
    assert paths.scaler_file() == "scaler.pt"
    assert paths.rng_file(3) == "random_states_3.pkl"
    assert paths.custom_object_file(0) == "custom_checkpoint_0.pkl"
    assert paths.dataloader_state_file(0) == "dl_state_dict.bin"
    assert paths.checkpoint_path("p", 4) == Path("p/checkpoints/checkpoint_4")


def _complete(folder: Path, payload: bytes = b"data") -> None:
    folder.mkdir(parents=True)
    write_manifest(folder, [write_bytes(folder, "a.bin", payload)], {"step": 1})


def test_manifest_round_trip_and_verification(tmp_path: Path) -> None:
    _complete(tmp_path / "c")
    manifest = read_manifest(tmp_path / "c")
    assert manifest["step"] == 1 and set(manifest["files"]) == {"a.bin"}
    assert read_verified(tmp_path / "c", "a.bin", manifest) == b"data"


def test_missing_manifest_is_a_partial_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    with pytest.raises(CorruptCheckpointError, match="missing"):
        read_manifest(tmp_path / "c")


def test_truncated_file_is_named(tmp_path: Path) -> None:
    _complete(tmp_path / "c")
    (tmp_path / "c" / "a.bin").write_bytes(b"da")
    with pytest.raises(CorruptCheckpointError, match=r"a\.bin is truncated"):
        read_manifest(tmp_path / "c")


def test_corrupted_file_fails_its_checksum(tmp_path: Path) -> None:
    _complete(tmp_path / "c")
    (tmp_path / "c" / "a.bin").write_bytes(b"DATA")
    manifest = read_manifest(tmp_path / "c")  # same size: only the checksum can tell
    with pytest.raises(CorruptCheckpointError, match=r"a\.bin is corrupted"):
        read_verified(tmp_path / "c", "a.bin", manifest)


def test_damaged_manifest_is_reported(tmp_path: Path) -> None:
    _complete(tmp_path / "c")
    (tmp_path / "c" / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="damaged"):
        read_manifest(tmp_path / "c")


def test_newest_complete_checkpoint_skips_partial_ones(tmp_path: Path) -> None:
    for i in (0, 1):
        _complete(paths.checkpoint_path(tmp_path, i))
    paths.checkpoint_path(tmp_path, 2).mkdir()  # crashed before its manifest
    (paths.checkpoint_path(tmp_path, 3)).mkdir()
    (paths.checkpoint_path(tmp_path, 3) / MANIFEST_NAME).write_text("{}")
    assert paths.newest_complete_checkpoint(tmp_path) == paths.checkpoint_path(tmp_path, 1)
    assert paths.newest_complete_checkpoint(tmp_path / "nothing") is None


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for i in range(4):
        _complete(paths.checkpoint_path(tmp_path, i))
    removed = paths.prune_checkpoints(tmp_path, 2)
    assert [p.name for p in removed] == ["checkpoint_0", "checkpoint_1"]
    assert [i for i, _ in paths.complete_checkpoints(tmp_path)] == [2, 3]
    with pytest.raises(ValueError, match="total_limit must be a positive"):
        paths.prune_checkpoints(tmp_path, 0)


def test_publish_replaces_an_existing_folder(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    _complete(final, b"old")
    staging = paths.staging_path(final)
    _complete(staging, b"new")
    paths.publish(staging, final)
    assert (final / "a.bin").read_bytes() == b"new"
    # the replaced folder is deleted on a background thread
    paths.wait_for_removals()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    _complete(staging, b"newer")
    paths.publish(staging, final)  # again: waits for nothing, replaces, removes
    paths.wait_for_removals()
    assert (final / "a.bin").read_bytes() == b"newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_dedupe_keeps_one_name_per_tied_tensor() -> None:
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    state = {"emb.weight": emb.weight, "head.weight": head.weight, "other": torch.ones(2)}
    kept, aliases = dedupe_shared_tensors(state)
    assert set(kept) == {"emb.weight", "other"}
    assert aliases == {"head.weight": "emb.weight"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_zero_copy_safetensors_reader_matches_the_library(dtype: torch.dtype) -> None:
    from safetensors.torch import load as reference

    state = {
        "a": torch.arange(7).to(dtype),
        "b": torch.arange(12).reshape(3, 4).to(dtype),
        "c": torch.ones(3, dtype=torch.bfloat16),
        "empty": torch.empty(0, 2),
    }
    data = safetensors_bytes(state)
    ours = tensors_from_safetensors(bytearray(data))
    theirs = reference(data)
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor)


def test_safetensors_reader_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a safetensors file"):
        tensors_from_safetensors(bytearray(b"\xff" * 16))


def test_rng_round_trip_restores_every_generator() -> None:
    saved = capture_rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng_state(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_rng_restore_failure_is_named_or_warned() -> None:
    bad = {"numpy_random_seed": "not a state"}
    with pytest.raises(RuntimeError, match="numpy_random_seed"):
        restore_rng_state(bad)
    with pytest.warns(RuntimeWarning, match="numpy_random_seed"):
        restore_rng_state(bad, strict=False)


def test_manifest_lists_every_file_once(tmp_path: Path) -> None:
    records = [write_bytes(tmp_path, "x", b"1"), write_bytes(tmp_path, "x", b"1")]
    with pytest.raises(RuntimeError, match="same checkpoint file"):
        write_manifest(tmp_path, records, {})
    assert not (tmp_path / MANIFEST_NAME).exists()
    assert json.loads(json.dumps({"ok": True}))

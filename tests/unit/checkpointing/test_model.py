"""save_model_weights: one file or shards plus index, tied weights once, stale shards removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hasten.checkpointing.model import plan_shards, save_model_weights


def _state() -> dict[str, torch.Tensor]:
    emb = torch.nn.Parameter(torch.randn(100, 10))  # 4,000 bytes
    return {
        "emb.weight": emb,
        "a.weight": torch.randn(50, 10),  # 2,000 bytes
        "b.weight": torch.randn(50, 10),
        "head.weight": emb,  # tied
    }


def test_plan_shards_respects_the_cap_in_order() -> None:
    state = {f"t{i}": torch.zeros(250) for i in range(5)}  # 1,000 bytes each
    assert plan_shards(state, 2000) == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert plan_shards({"big": torch.zeros(1000)}, 10) == [["big"]]


def test_single_file_with_tied_weights_once(tmp_path: Path) -> None:
    names = save_model_weights(_state(), tmp_path)
    assert names == ["model.safetensors"]
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(loaded) == ["a.weight", "b.weight", "emb.weight"]


def test_sharded_safetensors_with_index(tmp_path: Path) -> None:
    state = _state()
    names = save_model_weights(state, tmp_path, max_shard_size="5KB")
    assert names[-1] == "model.safetensors.index.json"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 8000
    merged: dict[str, torch.Tensor] = {}
    for shard in set(index["weight_map"].values()):
        merged.update(load_file(str(tmp_path / shard)))
    for key in ("emb.weight", "a.weight", "b.weight"):
        assert torch.equal(merged[key], state[key])
    assert {index["weight_map"][k] for k in merged} == set(names[:-1])


def test_bin_shards_and_stale_files_removed(tmp_path: Path) -> None:
    save_model_weights(_state(), tmp_path, max_shard_size=3000, safe_serialization=False)
    assert (tmp_path / "pytorch_model.bin.index.json").exists()
    save_model_weights(_state(), tmp_path, safe_serialization=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pytorch_model.bin"]
    loaded = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert loaded["head.weight"].data_ptr() == loaded["emb.weight"].data_ptr()


def test_bad_inputs(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        save_model_weights(_state(), tmp_path / "file")
    with pytest.raises(ValueError):
        save_model_weights(_state(), tmp_path / "d", max_shard_size="lots")


def test_gathered_saves_gather_one_shard_at_a_time_and_write_the_same_files(
    tmp_path: Path,
) -> None:
    state = _state()
    calls: list[list[str]] = []

    def gather(part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        calls.append(list(part))
        return {k: v.clone() for k, v in part.items()}  # a fresh full copy, as a gather gives

    plain = save_model_weights(state, tmp_path / "plain", max_shard_size="5KB")
    gathered = save_model_weights(state, tmp_path / "gathered", max_shard_size="5KB", gather=gather)
    assert gathered == plain
    assert calls == [["emb.weight"], ["a.weight", "b.weight"]]  # one call per shard file
    for name in plain:
        assert (tmp_path / "gathered" / name).read_bytes() == (
            tmp_path / "plain" / name
        ).read_bytes()
    # a process that only takes part in the gathers writes nothing but knows the names
    assert save_model_weights(state, tmp_path / "other", "5KB", gather=gather, write=False) == plain
    assert not (tmp_path / "other").exists()


def test_tied_names_removed_are_logged_like_accelerate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="hasten.checkpointing.model"):
        save_model_weights(_state(), tmp_path / "safe")
        save_model_weights(_state(), tmp_path / "bin", safe_serialization=False)  # keeps both
    removed = [r.getMessage() for r in caplog.records if "Removed shared tensor" in r.getMessage()]
    assert removed == [
        "Removed shared tensor {'head.weight'} while saving. This should be OK, but check by "
        "verifying that you don't receive any warning while reloading"
    ]


def test_one_stand_in_under_two_names_is_a_tie_other_stand_ins_are_not(tmp_path: Path) -> None:
    # Sharded engines hand out meta stand-ins (no storage to compare): only identity marks a tie.
    full = _state()
    shared = torch.empty(100, 10, device="meta")
    held = {
        "emb.weight": shared,
        "a.weight": torch.empty(50, 10, device="meta"),
        "b.weight": torch.empty(50, 10, device="meta"),
        "head.weight": shared,
    }
    calls: list[list[str]] = []

    def gather(part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        calls.append(list(part))
        return {k: full[k].detach().clone() for k in part}

    save_model_weights(held, tmp_path / "gathered", max_shard_size="5KB", gather=gather)
    save_model_weights(full, tmp_path / "plain", max_shard_size="5KB")
    assert calls == [["emb.weight"], ["a.weight", "b.weight"]]
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert (tmp_path / "gathered" / name).read_bytes() == (
            tmp_path / "plain" / name
        ).read_bytes()

"""The DCP storage of sharded parts: one DCP call, one plain DCP folder per part, hashed and verified."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.checkpointing.storage import checksum
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, FileRecord

PARTS = ("pytorch_model_fsdp_0", "optimizer_0")


def _state() -> dict[str, dict[str, Any]]:
    torch.manual_seed(0)
    model = {"layer.weight": torch.randn(64, 32), "layer.bias": torch.randn(64)}
    optimizer = {
        "state": {"layer.weight": {"exp_avg": torch.randn(64, 32), "step": torch.tensor(3.0)}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["layer.weight"]}],
    }
    return {PARTS[0]: model, PARTS[1]: optimizer}


def _dcp(call: str, state: dict[str, Any], **kwargs: Any) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        getattr(dcp, call)(state, no_dist=True, **kwargs)


def _save(root: Path, block_bytes: int = 4096) -> tuple[Any, dict[str, dict[str, Any]]]:
    from hasten.checkpointing.storage.dcp_storage import PartedWriter

    state = _state()
    for part in PARTS:
        (root / part).mkdir(parents=True)
    writer = PartedWriter(root, PARTS, block_bytes=block_bytes)
    _dcp("save", state, storage_writer=writer)
    return writer, state


def _manifest(records: list[FileRecord], block_bytes: int = 4096) -> dict[str, Any]:
    return {"block_bytes": block_bytes, "files": {r.name: r for r in records}}


def test_writer_digests_equal_block_hasher_over_the_written_files(tmp_path: Path) -> None:
    writer, _ = _save(tmp_path)
    names = sorted(r.name for r in writer.all_records)
    assert names == [f"{p}/{n}" for p in sorted(PARTS) for n in (".metadata", "__0_0.distcp")]
    assert sorted(r.name for r in writer.records) == sorted(n for n in names if "distcp" in n)
    for record in writer.all_records:
        data = (tmp_path / record.name).read_bytes()
        hasher = checksum.BlockHasher(4096)
        hasher.update(data)
        assert record.size == len(data) and len(record.blocks) > 0
        assert record.blocks == tuple(hasher.digests()), record.name
    assert not (tmp_path / ".metadata").exists()  # no index above the parts


def test_each_part_is_the_checkpoint_a_plain_dcp_save_of_it_writes(tmp_path: Path) -> None:
    _save(tmp_path / "parted")
    for part, state in _state().items():
        _dcp("save", state, checkpoint_id=tmp_path / "plain" / part)
        ours = pickle.loads((tmp_path / "parted" / part / ".metadata").read_bytes())
        plain = pickle.loads((tmp_path / "plain" / part / ".metadata").read_bytes())
        assert ours.state_dict_metadata == plain.state_dict_metadata
        assert ours.planner_data == plain.planner_data
        assert set(ours.storage_data) == set(plain.storage_data)
        # and plain dcp.load (what Accelerate's loaders call) reads it back
        template = _state()[part]
        for value in template.get("state", {}).get("layer.weight", {}).values():
            value.zero_()
        _dcp("load", template, checkpoint_id=tmp_path / "parted" / part)
        expected = _state()[part]
        if part == PARTS[0]:
            assert all(torch.equal(template[k], v) for k, v in expected.items())
        else:
            got = template["state"]["layer.weight"]["exp_avg"]
            assert torch.equal(got, expected["state"]["layer.weight"]["exp_avg"])
            assert template["param_groups"][0]["betas"] == (0.9, 0.99)


def _load(root: Path, manifest: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    from hasten.checkpointing.storage.dcp_storage import PartedReader

    template = _state()
    with torch.no_grad():
        template[PARTS[0]]["layer.weight"].zero_()
        template[PARTS[1]]["state"]["layer.weight"]["exp_avg"].zero_()
    reader = PartedReader(root, PARTS, manifest)
    try:
        _dcp("load", template, storage_reader=reader)
    finally:
        reader.close()
    return template


def test_reader_loads_every_part_in_one_call_verifying_what_it_reads(tmp_path: Path) -> None:
    writer, state = _save(tmp_path)
    loaded = _load(tmp_path, _manifest(writer.all_records))
    assert torch.equal(loaded[PARTS[0]]["layer.weight"], state[PARTS[0]]["layer.weight"])
    want = state[PARTS[1]]["state"]["layer.weight"]["exp_avg"]
    assert torch.equal(loaded[PARTS[1]]["state"]["layer.weight"]["exp_avg"], want)
    assert loaded[PARTS[1]]["param_groups"][0]["lr"] == 0.1
    # without a manifest (strict=False) nothing is verified, the same values load
    unverified = _load(tmp_path, None)
    assert torch.equal(unverified[PARTS[0]]["layer.bias"], state[PARTS[0]]["layer.bias"])


def test_a_damaged_shard_is_refused_before_any_tensor_is_filled(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    from hasten.checkpointing.storage.dcp_storage import PartedReader

    writer, _ = _save(tmp_path)
    manifest = _manifest(writer.all_records)
    shard = tmp_path / PARTS[1] / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    template = _state()
    before = template[PARTS[0]]["layer.weight"].clone()
    reader = PartedReader(tmp_path, PARTS, manifest)
    with pytest.raises(CheckpointException) as caught:
        _dcp("load", template, storage_reader=reader)
    errors = [f[0] for f in caught.value.failures.values()]
    assert isinstance(errors[0], CorruptCheckpointError)
    assert "optimizer_0/__0_0.distcp is corrupted: block" in str(errors[0])
    assert torch.equal(template[PARTS[0]]["layer.weight"], before)  # the intact part too


def test_a_damaged_or_unlisted_index_is_refused_naming_it(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.dcp_storage import PartedReader

    writer, _ = _save(tmp_path)
    manifest = _manifest(writer.all_records)
    index = tmp_path / PARTS[0] / ".metadata"
    index.write_bytes(index.read_bytes()[:-1] + b"\x00")
    with pytest.raises(CorruptCheckpointError, match=r"pytorch_model_fsdp_0/.metadata is damaged"):
        PartedReader(tmp_path, PARTS, manifest)
    del manifest["files"][f"{PARTS[0]}/.metadata"]
    with pytest.raises(CorruptCheckpointError, match="lists no .metadata"):
        PartedReader(tmp_path, PARTS, manifest)


def test_verified_shards_are_mapped_and_each_tensor_is_a_view_of_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hasten.checkpointing.storage.dcp_storage as dcp_storage

    writer, state = _save(tmp_path)
    ranges: list[tuple[int, int]] = []  # the address range of every mapped file
    original_map = dcp_storage.map_verified

    def spy_map(folder: Path, name: str, manifest: Any) -> Any:
        mapped = original_map(folder, name, manifest)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = torch.frombuffer(mapped, dtype=torch.uint8).data_ptr()
        ranges.append((start, start + len(mapped)))
        return mapped

    decoded: list[int] = []  # where each decoded tensor's data lies
    original_item = dcp_storage.load_tensor_item

    def spy_item(view: memoryview, storage: torch.UntypedStorage) -> torch.Tensor:
        tensor = original_item(view, storage)
        decoded.append(tensor.data_ptr())
        return tensor

    sliced: list[Any] = []
    slice_file = dcp_storage.PartedReader._slice_file
    monkeypatch.setattr(dcp_storage, "map_verified", spy_map)
    monkeypatch.setattr(dcp_storage, "load_tensor_item", spy_item)
    monkeypatch.setattr(
        dcp_storage.PartedReader,
        "_slice_file",
        lambda self, file, sinfo: sliced.append(sinfo) or slice_file(self, file, sinfo),
    )
    loaded = _load(tmp_path, _manifest(writer.all_records))
    assert torch.equal(loaded[PARTS[0]]["layer.weight"], state[PARTS[0]]["layer.weight"])
    want = state[PARTS[1]]["state"]["layer.weight"]["exp_avg"]
    assert torch.equal(loaded[PARTS[1]]["state"]["layer.weight"]["exp_avg"], want)
    assert loaded[PARTS[1]]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert len(ranges) == 2  # one file per part, mapped once
    assert len(decoded) == 4 and not sliced  # every tensor from the mappings, none by DCP's reader
    assert all(any(lo <= ptr < hi for lo, hi in ranges) for ptr in decoded)  # no copy before
    # the state dict's own, i.e. each tensor's data is copied once


@pytest.mark.parametrize("copy_below", [1 << 20, 0])  # small items copied; large ones viewed
def test_unverified_shards_are_read_by_dcp_small_items_copied_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copy_below: int
) -> None:
    import hasten.checkpointing.storage.dcp_storage as dcp_storage

    _, state = _save(tmp_path)
    monkeypatch.setattr(dcp_storage, "_COPY_ITEM_BYTES", copy_below)
    served: list[type] = []
    slice_file = dcp_storage.PartedReader._slice_file

    def counted(self: Any, file: Any, sinfo: Any) -> Any:
        out = slice_file(self, file, sinfo)
        served.append(type(out))
        return out

    monkeypatch.setattr(dcp_storage.PartedReader, "_slice_file", counted)
    loaded = _load(tmp_path, None)
    assert torch.equal(loaded[PARTS[0]]["layer.bias"], state[PARTS[0]]["layer.bias"])
    assert (io.BytesIO in set(served)) == bool(copy_below)

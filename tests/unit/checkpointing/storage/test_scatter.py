"""Scatter reads: each tensor's bytes go straight to their final memory, verified per block."""

from __future__ import annotations

import io
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hasten.checkpointing.storage import checksum
from hasten.checkpointing.storage.manifest import (
    CorruptCheckpointError,
    read_manifest,
    write_bytes,
    write_manifest,
)
from hasten.checkpointing.storage.reader import CheckpointReader, host_buffer, unpickle_buffer
from hasten.checkpointing.storage.scatter import (
    _block_views,
    check_blocks,
    place_tensors,
    submit_blocks,
)
from hasten.checkpointing.storage.tensors import safetensors_bytes


@settings(max_examples=80, deadline=None)
@given(
    layout=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), max_size=8),
    begin=st.integers(0, 300),
    length=st.integers(1, 120),
)
def test_block_views_cover_the_range_in_order(
    layout: list[tuple[int, int]], begin: int, length: int
) -> None:
    pieces, offset, marks = [], 0, {}
    for gap, size in layout:  # non-overlapping pieces separated by gaps
        offset += gap
        data = memoryview(bytearray(size))
        pieces.append((offset, data))
        marks[offset] = data
        offset += size
    end = begin + length
    views = _block_views(pieces, [o for o, _ in pieces], begin, end)
    assert sum(v.nbytes for v in views) == length
    # writing the range's bytes through the views lands each byte in its piece
    payload = bytes((begin + i) % 251 for i in range(length))
    cursor = 0
    for view in views:
        view[:] = payload[cursor : cursor + view.nbytes]
        cursor += view.nbytes
    for start, data in marks.items():
        for i in range(data.nbytes):
            if begin <= start + i < end:
                assert data[i] == (start + i) % 251


def _saved(tmp_path: Path, obj: object) -> tuple[Path, dict]:
    stream = io.BytesIO()
    torch.save(obj, stream)
    folder = tmp_path / "c"
    folder.mkdir()
    write_manifest(folder, [write_bytes(folder, "f.bin", stream.getvalue())], {})
    return folder, read_manifest(folder)


def _place_and_read(folder: Path, manifest: dict, like: object) -> object:
    path = folder / "f.bin"
    with open(path, "rb") as handle, ThreadPoolExecutor(2) as pool:
        size = os.fstat(handle.fileno()).st_size
        mapping = mmap.mmap(
            handle.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
        placement = place_tensors(unpickle_buffer(mapping), like, mapping, host_buffer)
        assert placement is not None
        record = manifest["files"]["f.bin"]
        blocks = submit_blocks(
            handle.fileno(), path, size, placement.pieces, manifest["block_bytes"], record, pool
        )
        check_blocks(path, blocks)
    return placement.result


def test_matching_tensors_are_reused_and_shared_storage_stays_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checksum, "BLOCK_BYTES", 256)  # many blocks, pieces straddling them
    base = torch.arange(100, dtype=torch.float32)
    saved = {
        "state": {0: {"exp_avg": torch.randn(30), "step": torch.tensor(5.0)}},
        "views": [base[:10], base[5:40]],  # two views of one storage
        "groups": [{"lr": 0.1, "params": [0]}],
        "bf16": torch.randn(7).to(torch.bfloat16),
    }
    folder, manifest = _saved(tmp_path, saved)
    live = {"exp_avg": torch.zeros(30), "step": torch.tensor(0.0)}
    like = {"state": {0: live}, "bf16": torch.zeros(7)}  # bf16 dtype differs: not reused
    loaded = _place_and_read(folder, manifest, like)
    assert loaded["state"][0]["exp_avg"] is live["exp_avg"]
    assert torch.equal(live["exp_avg"], saved["state"][0]["exp_avg"])
    assert loaded["state"][0]["step"] is live["step"] and float(live["step"]) == 5.0
    first, second = loaded["views"]
    assert torch.equal(first, base[:10]) and torch.equal(second, base[5:40])
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    assert torch.equal(loaded["bf16"], saved["bf16"]) and loaded["bf16"] is not like["bf16"]
    assert loaded["groups"] == [{"lr": 0.1, "params": [0]}]


def test_a_damaged_block_is_named_even_when_read_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checksum, "BLOCK_BYTES", 512)
    folder, manifest = _saved(tmp_path, {"w": torch.randn(1000)})
    path = folder / "f.bin"
    data = bytearray(path.read_bytes())
    data[2000] ^= 0xFF  # inside the tensor's bytes, block 3
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"f\.bin is corrupted: block 3"):
        _place_and_read(folder, manifest, {"w": torch.zeros(1000)})


def test_overlapping_tensors_are_left_to_the_plain_reader() -> None:
    file_buffer = host_buffer(4096)
    # two tensors over different but overlapping storages of the file
    first = torch.frombuffer(file_buffer, dtype=torch.uint8, count=100)
    second = torch.frombuffer(file_buffer, dtype=torch.uint8, count=100, offset=60)
    assert place_tensors({"a": first, "b": second}, None, file_buffer, host_buffer) is None


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 3))
    model[1].weight = torch.nn.Parameter(torch.randn(3, 64))
    return model


def test_large_safetensors_load_into_the_parameters_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.checkpointing.storage import reader

    monkeypatch.setattr(reader, "_SMALL_BYTES", 0)
    monkeypatch.setattr(checksum, "BLOCK_BYTES", 1024)
    saved = _model().state_dict()
    folder = tmp_path / "c"
    folder.mkdir()
    write_manifest(folder, [write_bytes(folder, "m.safetensors", safetensors_bytes(saved))], {})
    target = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 3))
    current = target.state_dict(keep_vars=True)
    with CheckpointReader(folder, read_manifest(folder)) as files:
        loaded = files.tensors("m.safetensors", like=current)
    for name, tensor in loaded.items():
        assert tensor is current[name]  # read in place: load_state_dict then copies nothing
        assert torch.equal(tensor.detach(), saved[name])

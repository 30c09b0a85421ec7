"""Block checksums, parallel verified reads into fresh memory, zero-copy unpickling."""

from __future__ import annotations

import gc
import io
import mmap
import os
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hasten.checkpointing.storage import checksum
from hasten.checkpointing.storage.io import UnsafeCheckpointError
from hasten.checkpointing.storage.manifest import (
    ChecksumWriter,
    CorruptCheckpointError,
    read_manifest,
    write_bytes,
    write_manifest,
)
from hasten.checkpointing.storage.reader import (
    CheckpointReader,
    host_buffer,
    map_verified,
    read_verified,
    unpickle_buffer,
)
from hasten.checkpointing.storage.threads import io_threads


def _reference_blocks(data: bytes, block: int) -> list[str]:
    return [
        f"{xxhash.xxh3_64_intdigest(data[i : i + block]):016x}" for i in range(0, len(data), block)
    ]


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.integers(min_value=0, max_value=300), max_size=12),
    block=st.sampled_from([1, 7, 64, 256]),
)
def test_block_hasher_matches_hashing_each_block_whole(pieces: list[int], block: int) -> None:
    data = bytes(i % 251 for i in range(sum(pieces)))
    hasher = checksum.BlockHasher(block)
    offset = 0
    for size in pieces:
        hasher.update(data[offset : offset + size])
        offset += size
    assert hasher.size == len(data)
    assert hasher.digests() == _reference_blocks(data, block)
    assert checksum.block_digests(data, block) == _reference_blocks(data, block)


def test_checksum_writer_records_size_and_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checksum, "BLOCK_BYTES", 1000)
    chunks = [b"abc", bytes(3000), torch.arange(700, dtype=torch.float32).numpy().data]
    with open(tmp_path / "f", "wb") as handle:
        writer = ChecksumWriter(handle)
        for chunk in chunks:
            writer.write(chunk)
    record = writer.record("f")
    data = (tmp_path / "f").read_bytes()
    assert record.size == len(data) == 3 + 3000 + 2800
    assert list(record.blocks) == _reference_blocks(data, 1000)


def _one_file(folder: Path, payload: bytes) -> dict:
    folder.mkdir()
    write_manifest(folder, [write_bytes(folder, "big.bin", payload)], {})
    return read_manifest(folder)


@pytest.mark.parametrize("size", [0, 5, 4096 * 3 + 123])
@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("read", [read_verified, map_verified])
def test_read_verified_returns_the_bytes_and_names_a_damaged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, threads: int, read: Any
) -> None:
    monkeypatch.setattr(checksum, "BLOCK_BYTES", 4096)
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    manifest = _one_file(tmp_path / "c", payload)
    assert manifest["block_bytes"] == 4096
    pool = ThreadPoolExecutor(threads) if threads else None
    try:
        assert bytes(read(tmp_path / "c", "big.bin", manifest, pool)) == payload
        if size:
            damaged = bytearray(payload)
            damaged[-1] ^= 0xFF
            (tmp_path / "c" / "big.bin").write_bytes(bytes(damaged))
            last = (size - 1) // 4096
            with pytest.raises(
                CorruptCheckpointError, match=rf"big\.bin is corrupted: block {last}"
            ):
                read(tmp_path / "c", "big.bin", manifest, pool)
            # without a manifest (strict=False) the bytes come back unverified
            assert bytes(read_verified(tmp_path / "c", "big.bin", None, pool)) == bytes(damaged)
    finally:
        if pool is not None:
            pool.shutdown()


@pytest.mark.parametrize("read", [read_verified, map_verified])
def test_read_verified_refuses_unlisted_and_resized_files(tmp_path: Path, read: Any) -> None:
    manifest = _one_file(tmp_path / "c", b"0123456789")
    (tmp_path / "c" / "other.bin").write_bytes(b"x")
    with pytest.raises(CorruptCheckpointError, match=r"other\.bin is not listed"):
        read(tmp_path / "c", "other.bin", manifest)
    (tmp_path / "c" / "big.bin").write_bytes(b"01234")
    with pytest.raises(CorruptCheckpointError, match=r"big\.bin is truncated"):
        read(tmp_path / "c", "big.bin", manifest)


def test_manifest_with_an_unknown_checksum_is_refused(tmp_path: Path) -> None:
    _one_file(tmp_path / "c", b"data")
    path = tmp_path / "c" / "hasten_manifest.json"
    path.write_text(path.read_text().replace('"xxh3_64"', '"md5"'))
    with pytest.raises(CorruptCheckpointError, match="'md5' checksums.*strict=False"):
        read_manifest(tmp_path / "c")


def test_host_buffer_is_writable_zeroed_memory() -> None:
    small, large = host_buffer(10), host_buffer(4 << 20)
    assert isinstance(small, bytearray) and len(small) == 10
    assert isinstance(large, mmap.mmap) and len(large) == 4 << 20
    view = torch.frombuffer(large, dtype=torch.uint8)
    assert int(view.sum()) == 0
    view.fill_(7)
    assert large[123] == 7


def test_unpickle_buffer_gives_views_that_keep_the_memory_alive() -> None:
    state = {"w": torch.randn(300_000), "step": torch.tensor(3.0), "names": ["a", 1]}
    stream = io.BytesIO()
    torch.save(state, stream)
    raw = stream.getvalue()
    buffer = host_buffer(len(raw))
    buffer[:] = raw
    loaded = unpickle_buffer(buffer)
    assert loaded["names"] == ["a", 1] and torch.equal(loaded["step"], state["step"])
    base = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    assert base <= loaded["w"].data_ptr() < base + len(raw)  # a view, not a copy
    del buffer, base
    gc.collect()
    host_buffer(len(raw))[:] = bytes(len(raw))  # fresh memory reuses nothing still referenced
    assert torch.equal(loaded["w"], state["w"])


def test_unpickle_buffer_refuses_code_and_takes_legacy_files() -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("pwned",))

    stream = io.BytesIO()
    torch.save({"x": Evil()}, stream)
    with pytest.raises(UnsafeCheckpointError, match="weights_only=False"):
        unpickle_buffer(bytearray(stream.getvalue()), source="evil.bin")
    legacy = io.BytesIO()
    torch.save({"t": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    assert torch.equal(unpickle_buffer(bytearray(legacy.getvalue()))["t"], torch.ones(3))
    with pytest.raises((pickle.UnpicklingError, RuntimeError, EOFError)):
        unpickle_buffer(bytearray())


def test_checkpoint_reader_reads_tensors_and_pickles(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.tensors import safetensors_bytes

    folder = tmp_path / "c"
    folder.mkdir()
    weights = {"a": torch.randn(4, 5), "b": torch.arange(6)}
    stream = io.BytesIO()
    torch.save({"lr": 0.1, "t": torch.ones(2)}, stream)
    records = [
        write_bytes(folder, "model.safetensors", safetensors_bytes(weights)),
        write_bytes(folder, "opt.bin", stream.getvalue()),
    ]
    write_manifest(folder, records, {})
    with CheckpointReader(folder, read_manifest(folder)) as files:
        assert files.exists("opt.bin") and not files.exists("nope.bin")
        tensors = files.tensors("model.safetensors")
        assert all(torch.equal(tensors[k], v) for k, v in weights.items())
        loaded = files.unpickle("opt.bin")
        assert loaded["lr"] == 0.1 and torch.equal(loaded["t"], torch.ones(2))


@pytest.mark.timeout(120)
def test_loads_share_one_read_pool_at_once_nested_and_in_a_forked_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checksum, "BLOCK_BYTES", 64 << 10)
    folder = tmp_path / "c"
    folder.mkdir()
    big = torch.randn(1 << 19)  # 2 MiB: its blocks are read on the pool's threads
    stream = io.BytesIO()
    torch.save({"t": big}, stream)
    write_manifest(folder, [write_bytes(folder, "opt.bin", stream.getvalue())], {})
    manifest = read_manifest(folder)

    expected = big.numpy().tobytes()  # compared as bytes: torch ops may hang a forked child

    def nested_loads() -> bool:
        with CheckpointReader(folder, manifest) as outer:
            pending = outer.start_unpickle("opt.bin")  # blocks queued, not waited for
            with CheckpointReader(folder, manifest) as inner:  # a load inside a load
                ok = inner.unpickle("opt.bin")["t"].numpy().tobytes() == expected
            return ok and pending.result()["t"].numpy().tobytes() == expected

    from hasten.checkpointing.storage import scatter

    readers: set[threading.Thread] = set()
    real_read_views = scatter.read_views

    def read_views(*args: Any) -> None:
        readers.add(threading.current_thread())
        real_read_views(*args)

    pool = io_threads()
    with monkeypatch.context() as patch:
        patch.setattr(scatter, "read_views", read_views)
        with ThreadPoolExecutor(4) as callers:  # loads from several threads at once
            assert all(callers.map(lambda _: nested_loads(), range(8)))
    # the same few threads read for every load, and are kept for the next one
    assert io_threads() is pool
    assert 1 < len(readers) <= 8 and all(t.is_alive() for t in readers), readers
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit code
        ok = False
        try:
            ok = nested_loads() and io_threads() is not pool  # the parent's threads are gone
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, 9)
        os.waitpid(child, 0)
    assert done[0] == child and os.waitstatus_to_exitcode(done[1]) == 0

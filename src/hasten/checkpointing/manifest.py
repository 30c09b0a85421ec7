"""The manifest of a checkpoint: every file with its size and CRC32, written last.

A checkpoint folder is complete exactly when its manifest exists and every file it lists has
the recorded size and checksum. CRC32 (zlib) runs at several GB/s here, so it costs a small
fraction of the disk time; it is computed while writing and while reading, never in a second pass.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hasten.checkpointing.io import atomic_write, fsync_directory

__all__ = [
    "ChecksumWriter",
    "CorruptCheckpointError",
    "FileRecord",
    "MANIFEST_NAME",
    "read_manifest",
    "read_verified",
    "verify_file",
    "write_bytes",
    "write_manifest",
]

MANIFEST_NAME = "hasten_manifest.json"
_FORMAT = 1


class CorruptCheckpointError(RuntimeError):
    """A checkpoint is partial or damaged; the message names the bad file."""


@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint, relative to its folder."""

    name: str
    size: int
    crc32: int


class _CrcPipe:
    """CRC32 of a stream, computed on a helper thread while the caller reads the next chunk.

    ``readinto`` and ``zlib.crc32`` both release the GIL, so verifying costs almost no time on
    top of reading when two cores are free; chunks are checksummed in the order fed.
    """

    def __init__(self) -> None:
        self.crc = 0
        self._queue: queue.SimpleQueue[tuple[memoryview, threading.Event | None] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="hasten-crc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            view, done = item
            self.crc = zlib.crc32(view, self.crc)
            view.release()
            if done is not None:
                done.set()

    def feed(self, view: memoryview, done: threading.Event | None = None) -> None:
        """Checksum ``view`` next; set ``done`` once its buffer may be reused."""
        self._queue.put((view, done))

    def result(self) -> int:
        """Wait for every chunk fed so far and return the running CRC32."""
        self._queue.put(None)
        self._thread.join()
        return self.crc


# Chunks at least this large are checksummed on a helper thread while they are written.
_OVERLAP_BYTES = 1 << 20


class ChecksumWriter:
    """A binary file wrapper that counts bytes and updates a CRC32 as they are written.

    For large chunks the CRC runs on a helper thread during the write system call (both
    release the GIL); `write` returns only when both are done, so callers may reuse buffers.
    Call `close` when done writing.
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._pipe: _CrcPipe | None = None
        self.size = 0
        self.crc32 = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` through, updating size and checksum."""
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        nbytes = view.nbytes
        self.size += nbytes
        if nbytes < _OVERLAP_BYTES:
            self.crc32 = zlib.crc32(view, self.crc32)
            return self._handle.write(data)
        if self._pipe is None:
            self._pipe = _CrcPipe()
        pipe, done = self._pipe, threading.Event()
        pipe.crc = self.crc32  # the pipe is idle here: the previous chunk's done was awaited
        pipe.feed(view, done)
        written = self._handle.write(data)
        done.wait()
        self.crc32 = pipe.crc
        return written

    def flush(self) -> None:
        """Flush the underlying file."""
        self._handle.flush()

    def close(self) -> None:
        """Stop the helper thread (the file itself is the caller's to close)."""
        if self._pipe is not None:
            self._pipe.result()
            self._pipe = None


def write_bytes(folder: Path, name: str, data: bytes) -> FileRecord:
    """Write ``data`` to ``folder/name`` durably and return its record."""
    with atomic_write(folder / name) as handle:
        handle.write(data)
    return FileRecord(name, len(data), zlib.crc32(data))


def write_manifest(folder: Path, records: list[FileRecord], extra: dict[str, Any]) -> None:
    """Write the manifest last: its presence marks the folder complete."""
    names = [r.name for r in records]
    if len(names) != len(set(names)):
        raise RuntimeError(f"Two processes wrote the same checkpoint file in {folder}: {names}")
    payload = {
        "format": _FORMAT,
        "files": [asdict(r) for r in sorted(records, key=lambda r: r.name)],
        **extra,
    }
    with atomic_write(folder / MANIFEST_NAME) as handle:
        handle.write(json.dumps(payload, indent=1).encode())
    fsync_directory(folder)


def read_manifest(folder: Path) -> dict[str, Any]:
    """Read and check the manifest of ``folder``: every listed file present with its size.

    Raises:
        CorruptCheckpointError: no manifest (the save never finished), or a file is missing or
            has the wrong size.
    """
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise CorruptCheckpointError(
            f"{folder} is not a complete hasten checkpoint: {MANIFEST_NAME} is missing (the save "
            "was interrupted, or the folder was not written by hasten). Load an earlier "
            "checkpoint, or pass strict=False to load what is there without verification."
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = {f["name"]: FileRecord(**f) for f in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(
            f"{path} is damaged ({exc}); load an earlier checkpoint."
        ) from exc
    for record in files.values():
        target = folder / record.name
        if not target.is_file():
            raise CorruptCheckpointError(f"{target} is listed in the manifest but missing.")
        size = os.path.getsize(target)
        if size != record.size:
            raise CorruptCheckpointError(
                f"{target} is truncated or damaged: {size} bytes, the manifest says {record.size}."
            )
    manifest["files"] = files
    return manifest


_CHUNK = 8 << 20


def _check(path: Path, name: str, size: int, crc: int, manifest: dict[str, Any]) -> None:
    record = manifest["files"].get(name)
    if record is None:
        raise CorruptCheckpointError(f"{path} is not listed in the checkpoint manifest.")
    if size != record.size or crc != record.crc32:
        raise CorruptCheckpointError(
            f"{path} is corrupted: its checksum does not match the manifest. Load an earlier "
            "checkpoint."
        )


def verify_file(folder: Path, name: str, manifest: dict[str, Any] | None) -> Path:
    """Check ``folder/name`` against the manifest by streaming it (no copy held); return it.

    For large files that are then memory-mapped rather than read whole.
    """
    path = folder / name
    if manifest is None:
        return path
    if name not in manifest["files"]:
        _check(path, name, 0, 0, manifest)
    pipe, size = _CrcPipe(), 0
    buffers = [bytearray(_CHUNK), bytearray(_CHUNK)]
    free = [threading.Event(), threading.Event()]
    for event in free:
        event.set()
    with open(path, "rb", buffering=0) as handle:
        turn = 0
        while True:
            free[turn].wait()
            free[turn].clear()
            count = handle.readinto(buffers[turn])
            if not count:
                free[turn].set()
                break
            pipe.feed(memoryview(buffers[turn])[:count], free[turn])
            size += count
            turn ^= 1
    _check(path, name, size, pipe.result(), manifest)
    return path


def read_verified(folder: Path, name: str, manifest: dict[str, Any] | None) -> bytearray:
    """Read ``folder/name`` whole, checking it against the manifest when there is one.

    The bytes land in one writable buffer (tensors can be views of it): no second copy. The
    checksum runs on a helper thread behind the read.
    """
    path = folder / name
    pipe = _CrcPipe() if manifest is not None else None
    with open(path, "rb", buffering=0) as handle:
        data = bytearray(os.fstat(handle.fileno()).st_size)
        view, filled = memoryview(data), 0
        while filled < len(data) and (count := handle.readinto(view[filled : filled + _CHUNK])):
            if pipe is not None:
                pipe.feed(view[filled : filled + count])
            filled += count
    crc = pipe.result() if pipe is not None else 0
    view.release()
    if filled < len(data):
        del data[filled:]  # the file shrank while being read
    if manifest is not None:
        _check(path, name, len(data), crc, manifest)
    return data

"""The manifest of a checkpoint: every file with its size and CRC32, written last.

A checkpoint folder is complete exactly when its manifest exists and every file it lists has
the recorded size and checksum. CRC32 (zlib) runs at several GB/s here, so it costs a small
fraction of the disk time; it is computed while writing and while reading, never in a second pass.
"""

from __future__ import annotations

import json
import os
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


class ChecksumWriter:
    """A binary file wrapper that counts bytes and updates a CRC32 as they are written."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.size = 0
        self.crc32 = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` through, updating size and checksum."""
        self.crc32 = zlib.crc32(data, self.crc32)
        self.size += len(data)
        return self._handle.write(data)

    def flush(self) -> None:
        """Flush the underlying file."""
        self._handle.flush()


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


def verify_file(folder: Path, name: str, manifest: dict[str, Any] | None) -> Path:
    """Check ``folder/name`` against the manifest by streaming it (no copy held); return it.

    For large files that are then memory-mapped rather than read whole.
    """
    path = folder / name
    if manifest is None:
        return path
    record = manifest["files"].get(name)
    if record is None:
        raise CorruptCheckpointError(f"{path} is not listed in the checkpoint manifest.")
    crc, size = 0, 0
    chunk = bytearray(_CHUNK)
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(chunk):
            crc = zlib.crc32(view[:count], crc)
            size += count
    if size != record.size or crc != record.crc32:
        raise CorruptCheckpointError(
            f"{path} is corrupted: its checksum does not match the manifest. Load an earlier "
            "checkpoint."
        )
    return path


def read_verified(folder: Path, name: str, manifest: dict[str, Any] | None) -> bytearray:
    """Read ``folder/name`` whole, checking it against the manifest when there is one.

    The bytes land in one writable buffer (tensors can be views of it): no second copy.
    """
    path = folder / name
    with open(path, "rb", buffering=0) as handle:
        data = bytearray(os.fstat(handle.fileno()).st_size)
        view, filled = memoryview(data), 0
        while filled < len(data) and (count := handle.readinto(view[filled:])):
            filled += count
    del view
    if filled < len(data):
        del data[filled:]  # the file shrank while being read
    if manifest is None:
        return data
    record = manifest["files"].get(name)
    if record is None:
        raise CorruptCheckpointError(f"{folder / name} is not listed in the checkpoint manifest.")
    if len(data) != record.size or zlib.crc32(data) != record.crc32:
        raise CorruptCheckpointError(
            f"{folder / name} is corrupted: its checksum does not match the manifest. Load an "
            "earlier checkpoint."
        )
    return data

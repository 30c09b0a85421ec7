"""The manifest of a checkpoint: every file with its size and block checksums, written last.

A checkpoint folder is complete exactly when its manifest exists and every file it lists has
the recorded size and checksums. When the processes saved into folders they do not share, each
folder has its own manifest, named after the lowest rank that wrote there
(``hasten_manifest.json`` for rank 0's, ``hasten_manifest_<rank>.json`` for the others), so
folders copied together (as Ray Train does with its workers' checkpoints) keep every manifest
and read as one. Checksums are computed while writing (see `ChecksumWriter`) and
while reading (see `hasten.checkpointing.storage.reader`), never in a separate pass over the data.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hasten.checkpointing.storage import checksum
from hasten.checkpointing.storage.io import EarlyWriteback, atomic_write, fsync_directory

__all__ = [
    "ChecksumWriter",
    "CorruptCheckpointError",
    "FileRecord",
    "MANIFEST_NAME",
    "manifest_name",
    "read_manifest",
    "write_bytes",
    "write_manifest",
]

MANIFEST_NAME = "hasten_manifest.json"
_PART_MANIFEST = re.compile(r"^hasten_manifest_(\d+)\.json$")
_FORMAT = 2


def manifest_name(owner: int) -> str:
    """The manifest's name in a folder whose lowest writing rank is ``owner``."""
    return MANIFEST_NAME if owner == 0 else f"hasten_manifest_{owner}.json"


class CorruptCheckpointError(RuntimeError):
    """A checkpoint is partial or damaged; the message names the bad file."""


@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint, relative to its folder, with the digest of each block."""

    name: str
    size: int
    blocks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The record as stored in the manifest and in the per-process record files."""
        return {"name": self.name, "size": self.size, "blocks": list(self.blocks)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileRecord:
        """Inverse of `to_json`."""
        return cls(str(data["name"]), int(data["size"]), tuple(data["blocks"]))


class ChecksumWriter:
    """A binary file wrapper that counts bytes and hashes each block as it is written."""

    def __init__(self, handle: BinaryIO | EarlyWriteback) -> None:
        self._handle = handle
        self._hasher = checksum.BlockHasher(checksum.BLOCK_BYTES)

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._hasher.size

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` through, updating size and checksums."""
        self._hasher.update(data)
        return self._handle.write(data)

    def flush(self) -> None:
        """Flush the underlying file."""
        self._handle.flush()

    def record(self, name: str) -> FileRecord:
        """The record of what was written, once writing is done."""
        return FileRecord(name, self._hasher.size, tuple(self._hasher.digests()))


def write_bytes(folder: Path, name: str, data: bytes) -> FileRecord:
    """Write ``data`` to ``folder/name`` durably and return its record."""
    with atomic_write(folder / name) as handle:
        handle.write(data)
    return FileRecord(name, len(data), tuple(checksum.block_digests(data, checksum.BLOCK_BYTES)))


def write_manifest(
    folder: Path, records: list[FileRecord], extra: dict[str, Any], name: str = MANIFEST_NAME
) -> None:
    """Write the manifest last into a staging folder: its presence marks the folder complete.

    No temporary file is needed: nothing reads a staging folder before it is renamed into
    place, which happens only after this returns (manifest and folder fsynced).
    """
    names = [r.name for r in records]
    if len(names) != len(set(names)):
        raise RuntimeError(f"Two processes wrote the same checkpoint file in {folder}: {names}")
    payload = {
        "format": _FORMAT,
        "checksum": checksum.ALGORITHM,
        "block_bytes": checksum.BLOCK_BYTES,
        "files": [r.to_json() for r in sorted(records, key=lambda r: r.name)],
        **extra,
    }
    with open(folder / name, "wb") as handle:
        handle.write(json.dumps(payload, indent=1).encode())
        handle.flush()
        os.fsync(handle.fileno())
    fsync_directory(folder)


def _parse(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = {f["name"]: FileRecord.from_json(f) for f in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(
            f"{path} is damaged ({exc}); load an earlier checkpoint."
        ) from exc
    algorithm, block_bytes = manifest.get("checksum"), manifest.get("block_bytes")
    if algorithm != checksum.ALGORITHM or not isinstance(block_bytes, int) or block_bytes <= 0:
        raise CorruptCheckpointError(
            f"{path} records {algorithm!r} checksums over {block_bytes!r}-byte blocks; this "
            f"version of hasten verifies {checksum.ALGORITHM!r} over a positive block size. "
            "Load it with strict=False to skip verification, or with the hasten that wrote it."
        )
    manifest["files"] = files
    return manifest


def _part_manifests(folder: Path) -> list[Path]:
    """The manifests of other folders of the same save copied into ``folder``, by rank."""
    parts = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            match = _PART_MANIFEST.match(entry.name)
            if match:
                parts.append((int(match.group(1)), folder / entry.name))
    return [path for _, path in sorted(parts)]


def _merge(manifests: list[dict[str, Any]], paths: list[Path]) -> dict[str, Any]:
    """One manifest of several folders' manifests of the same save (copied into one folder)."""
    merged = dict(manifests[0])
    files = dict(merged["files"])
    for manifest, path in zip(manifests[1:], paths[1:]):
        if manifest.get("save") != merged.get("save"):
            raise CorruptCheckpointError(
                f"{path} belongs to another save than {paths[0]}: this folder mixes files of "
                "two checkpoints. Copy together only the folders of one save."
            )
        for name, record in manifest["files"].items():
            files.setdefault(name, record)
    merged["files"] = files
    return merged


def _read(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, several merged into one, or None when it has none."""
    main = folder / MANIFEST_NAME
    if main.is_file():
        manifest = _parse(main)
        if "processes" not in manifest:  # one folder for every process: the only manifest
            return manifest
        paths = [main, *_part_manifests(folder)]
        return _merge([manifest, *(_parse(p) for p in paths[1:])], paths)
    paths = _part_manifests(folder)
    return _merge([_parse(p) for p in paths], paths) if paths else None


def read_manifest(folder: Path) -> dict[str, Any]:
    """Read and check the manifest of ``folder``: every listed file present with its size.

    Several manifests (folders of one save that processes did not share, copied together) are
    read as one.

    Raises:
        CorruptCheckpointError: no manifest (the save never finished), a file is missing or has
            the wrong size, or the manifests are of different saves.
    """
    manifest = _read(folder)
    if manifest is None:
        raise CorruptCheckpointError(
            f"{folder} is not a complete hasten checkpoint: {MANIFEST_NAME} is missing (the save "
            "was interrupted, or the folder was not written by hasten). Load an earlier "
            "checkpoint, or pass strict=False to load what is there without verification."
        )
    for record in manifest["files"].values():
        target = folder / record.name
        if not target.is_file():
            raise CorruptCheckpointError(f"{target} is listed in the manifest but missing.")
        size = os.path.getsize(target)
        if size != record.size:
            raise CorruptCheckpointError(
                f"{target} is truncated or damaged: {size} bytes, the manifest says {record.size}."
            )
    return manifest

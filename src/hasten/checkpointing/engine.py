"""Checkpoints written by an engine (DeepSpeed) inside hasten's staged, verified folder.

The engine writes its own files (each process its ZeRO partition) into the staging folder;
hasten then checksums and fsyncs them (each process a share of the files), lists them in the
manifest with everything else, and publishes the folder by renaming it, so a kill at any moment
leaves the previous checkpoint loadable. On load, every engine file is verified against the
manifest (each process a share) before the engine reads any of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from hasten.checkpointing import checksum
from hasten.checkpointing.io import fsync_directory
from hasten.checkpointing.manifest import CorruptCheckpointError, FileRecord

__all__ = [
    "EngineCheckpoint",
    "engine_file_names",
    "record_existing",
    "sync_directories",
    "verify_existing",
]

_READ_BYTES = 16 << 20


class EngineCheckpoint(Protocol):
    """What a strategy whose engine writes its own checkpoint provides."""

    def save_checkpoint(self, folder: Path) -> None:
        """Write the engine state into ``folder`` (every process together)."""
        ...

    def load_checkpoint(self, folder: Path, strict: bool = True) -> None:
        """Restore the engine state from ``folder`` (every process together)."""
        ...


def engine_file_names(folder: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Every file under ``folder`` (relative, sorted), except hidden ones and ``skip``."""
    names = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), folder)
            if not name.startswith(".") and relative not in skip:
                names.append(relative)
    return sorted(names)


def _hash(path: Path, block_bytes: int) -> tuple[int, list[str]]:
    hasher = checksum.BlockHasher(block_bytes)
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(_READ_BYTES)
        view = memoryview(buffer)
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            hasher.update(view[:n])
    return hasher.size, hasher.digests()


def record_existing(folder: Path, name: str) -> FileRecord:
    """Checksum and fsync a file someone else wrote into ``folder``; return its record."""
    path = folder / name
    size, digests = _hash(path, checksum.BLOCK_BYTES)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return FileRecord(name, size, tuple(digests))


def sync_directories(folder: Path, names: list[str]) -> None:
    """Fsync every subdirectory holding one of ``names`` (the renames inside must be durable)."""
    for parent in sorted({(folder / n).parent for n in names}):
        if parent != folder:
            fsync_directory(parent)


def verify_existing(folder: Path, manifest: dict[str, Any], names: list[str]) -> None:
    """Check ``names`` against the manifest's sizes and block checksums.

    Raises:
        CorruptCheckpointError: a file is not listed, or its size or a block differs.
    """
    block_bytes = int(manifest["block_bytes"])
    for name in names:
        record = manifest["files"].get(name)
        path = folder / name
        if record is None:
            raise CorruptCheckpointError(f"{path} is not listed in the checkpoint manifest.")
        size, digests = _hash(path, block_bytes)
        if size != record.size or tuple(digests) != record.blocks:
            raise CorruptCheckpointError(
                f"{path} is damaged: its contents do not match the checksums in the manifest. "
                "Load an earlier checkpoint."
            )

"""Checkpoints written by an engine (DeepSpeed) inside hasten's staged, verified folder.

The engine hands each of its files (each process its ZeRO partition) to `EngineFiles`, which
writes it through hasten's writer: the bytes are hashed as they are written and the file is
fsynced on a background thread while the engine goes on, so nothing is read back. For an
asynchronous save the state is copied to host memory instead and written by the save's thread.
Files the engine writes by itself (its ``latest`` tag file, its recovery script, or every file
of a non-default checkpoint engine) are checksummed and fsynced afterwards (`record_existing`).
All are listed in the manifest and the folder is published by one rename, so a kill at any
moment leaves the previous checkpoint loadable. On load, every engine file is verified against
the manifest (each process a share) before the engine reads any of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from hasten.checkpointing import checksum
from hasten.checkpointing.io import EarlyWriteback, file_threads, fsync_directory, fsync_path
from hasten.checkpointing.manifest import ChecksumWriter, CorruptCheckpointError, FileRecord

__all__ = [
    "EngineCheckpoint",
    "EngineFiles",
    "engine_file_names",
    "hash_existing",
    "record_existing",
    "subdirectories",
    "sync_directories",
    "verify_existing",
]

_READ_BYTES = 16 << 20


class EngineCheckpoint(Protocol):
    """What a strategy whose engine writes its own checkpoint provides."""

    def save_checkpoint(self, folder: Path, files: EngineFiles | None = None) -> None:
        """Write the engine state into ``folder`` (every process together), via ``files``."""
        ...

    def load_checkpoint(self, folder: Path, strict: bool = True) -> None:
        """Restore the engine state from ``folder`` (every process together)."""
        ...


Serializer = Callable[[Any, BinaryIO], None]


class EngineFiles:
    """The files one process's engine writes during a save, taken through hasten's writer.

    Synchronously, `write` serialises the file at once through a hashing writer and queues its
    fsync on a background thread. With ``copy`` (an asynchronous save), `write` only copies the
    object to host memory; `jobs` then gives the files for the save's thread to write. A failure
    is kept, not raised into the engine (which would leave the other processes waiting in its
    collectives), and reported by `finish`, which every process reaches.

    Args:
        folder: the staging folder the engine writes into.
        copy: copies an object's tensors to host memory (asynchronous saves), or None.
        on_first_write: called before the first file is taken (the folder exists by then
            on every process), e.g. to start writing hasten's own files beside the engine's.
    """

    def __init__(
        self,
        folder: Path,
        copy: Callable[[Any], Any] | None = None,
        on_first_write: Callable[[], None] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self._copy = copy
        self._on_first_write = on_first_write
        self._records: list[FileRecord] = []
        self._queued: list[tuple[str, Any, Serializer]] = []
        self._syncs: list[tuple[str, Future[None]]] = []
        self.failure: tuple[str, BaseException] | None = None

    def _name(self, path: str) -> str:
        name = os.path.relpath(os.path.abspath(path), self.folder)
        if name.startswith(os.pardir) or os.path.isabs(name):
            raise ValueError(
                f"The engine wrote {path} outside the checkpoint folder {self.folder}."
            )
        return name

    def write(self, path: str, obj: Any, serialize: Serializer) -> None:
        """Take one file of the engine: written now (hashed, fsync queued) or copied for later."""
        if self.failure is not None:
            return
        name = path
        try:
            if self._on_first_write is not None:
                started, self._on_first_write = self._on_first_write, None
                started()
            name = self._name(path)
            if self._copy is not None:
                self._queued.append((name, self._copy(obj), serialize))
                return
            with open(self.folder / name, "wb") as handle:
                writer = ChecksumWriter(EarlyWriteback(handle))
                serialize(obj, writer)  # type: ignore[arg-type]
                handle.flush()
            self._records.append(writer.record(name))
            future = file_threads().submit(fsync_path, self.folder / name)
            self._syncs.append((name, future))
        except Exception as exc:  # noqa: BLE001 - reported by finish() on this process
            self.failure = (name, exc)

    def jobs(self) -> list[tuple[str, Callable[[BinaryIO], None]]]:
        """(name, write) of every file copied for an asynchronous save, in the engine's order."""
        queued, self._queued = self._queued, []
        return [(name, _bound(serialize, obj)) for name, obj, serialize in queued]

    def finish(self) -> list[FileRecord]:
        """Wait for the files' fsyncs; return the records.

        Raises:
            Exception: the first failure of a write or an fsync, with the file's name in
                ``failure``.
        """
        for name, future in self._syncs:
            try:
                future.result()
            except OSError as exc:
                self.failure = self.failure or (name, exc)
        if self.failure is not None:
            raise self.failure[1]
        records, self._records, self._syncs = self._records, [], []
        return records  # their folders are fsynced by the writer, once, before publishing


def _bound(serialize: Serializer, obj: Any) -> Callable[[BinaryIO], None]:
    return lambda handle: serialize(obj, handle)


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


def hash_existing(folder: Path, name: str) -> FileRecord:
    """Checksum a file someone else wrote into ``folder``; return its record (not fsynced)."""
    size, digests = _hash(folder / name, checksum.BLOCK_BYTES)
    return FileRecord(name, size, tuple(digests))


def record_existing(folder: Path, name: str) -> FileRecord:
    """Checksum and fsync a file someone else wrote into ``folder``; return its record."""
    record = hash_existing(folder, name)
    fsync_path(folder / name)
    return record


def subdirectories(folder: Path, names: list[str]) -> list[Path]:
    """The subdirectories of ``folder`` holding one of ``names`` (relative file names)."""
    return sorted({(folder / n).parent for n in names} - {folder})


def sync_directories(folder: Path, names: list[str]) -> None:
    """Fsync every subdirectory holding one of ``names`` (the entries inside must be durable)."""
    for parent in subdirectories(folder, names):
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

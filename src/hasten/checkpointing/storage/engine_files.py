"""Files an engine (DeepSpeed) writes into hasten's staged, verified folder, and reads back.

The engine hands each of its files (each process its ZeRO partition) to `EngineFiles`, which
writes it through hasten's writer: the bytes are hashed as they are written and the file is
fsynced on a background thread while the engine goes on, so nothing is read back. For an
asynchronous save the state is copied to host memory instead and written by the save's thread.
Files the engine writes by itself (its ``latest`` tag file, its recovery script, or every file
of a non-default checkpoint engine) are checksummed and fsynced afterwards (`record_existing`).
All are listed in the manifest and the folder is published by one rename, so a kill at any
moment leaves the previous checkpoint loadable. On load (`EngineReads`), every engine file is
verified against the manifest before the engine reads any of it, each by a process that reads it
anyway: the engine then parses the very bytes that were checked, so each file is read once. The
engine layout (`hasten.checkpointing.layouts.engine`) drives both.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Collection
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, cast

from hasten.checkpointing.storage import checksum
from hasten.checkpointing.storage.io import (
    EarlyWriteback,
    ViewFile,
    fsync_directory,
    fsync_path,
)
from hasten.checkpointing.storage.manifest import ChecksumWriter, CorruptCheckpointError, FileRecord
from hasten.checkpointing.storage.reader import Buffer, map_verified
from hasten.checkpointing.storage.threads import io_threads

__all__ = [
    "EngineFiles",
    "EngineReads",
    "engine_file_names",
    "files_to_verify",
    "hash_existing",
    "record_existing",
    "subdirectories",
    "sync_directories",
]

_READ_BYTES = 16 << 20


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
    """

    def __init__(
        self,
        folder: Path,
        copy: Callable[[Any], Any] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self._copy = copy
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
            name = self._name(path)
            if self._copy is not None:
                self._queued.append((name, self._copy(obj), serialize))
                return
            with open(self.folder / name, "wb") as handle:
                writer = ChecksumWriter(EarlyWriteback(handle))
                serialize(obj, writer)  # type: ignore[arg-type]
                handle.flush()
            self._records.append(writer.record(name))
            future = io_threads().submit(fsync_path, self.folder / name)
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


def files_to_verify(
    names: list[str],
    index: int,
    count: int,
    readers: Callable[[str, int], Collection[int]],
) -> list[str]:
    """The engine files process ``index`` of ``count`` verifies before the engine loads.

    Those its own engine will read (so it reads each once, see `EngineReads`), and a share of
    those no process's engine reads through hasten; every file is thus checked by someone.
    """
    mine = [n for n in names if index in readers(n, count)]
    unread = [n for n in names if not readers(n, count)]
    return mine + unread[index::count]


class EngineReads:
    """The engine files one process verifies before a load and then hands the engine to parse.

    `verify` maps each file and checks its blocks against the manifest from the map (hashed on
    the I/O threads); the engine's loads then parse those same pages through `read`, so no file
    is read a second time and nothing is parsed before every process's files were checked. Use
    it as a context manager: leaving it unmaps the files.

    Args:
        folder: the checkpoint folder.
        manifest: its manifest.
    """

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self._verified: dict[str, Buffer] = {}

    def __enter__(self) -> EngineReads:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        verified, self._verified = self._verified, {}
        for data in verified.values():
            _close(data)

    def verify(self, names: list[str]) -> None:
        """Check ``names`` against the manifest, keeping them mapped for `read`.

        Raises:
            CorruptCheckpointError: a file is not listed, or its size or a block differs.
        """
        for name in names:
            self._verified[name] = map_verified(self.folder, name, self.manifest, io_threads())

    def read(self, path: str, load: Callable[[BinaryIO], Any]) -> Any:
        """``load(file)`` of the engine file ``path``, over its verified bytes.

        A file `verify` did not map (one this process was not expected to read) is verified now.
        A file read again (DeepSpeed parses its model file twice) comes from the same pages.

        Raises:
            CorruptCheckpointError: the file is outside the checkpoint, not listed, or damaged.
        """
        name = os.path.relpath(os.path.abspath(path), self.folder.absolute())
        if name.startswith(os.pardir) or os.path.isabs(name):
            raise CorruptCheckpointError(
                f"{path} is not part of the checkpoint {self.folder}, so it is not verified."
            )
        data = self._verified.get(name)
        if data is None:
            data = map_verified(self.folder, name, self.manifest, io_threads())
            self._verified[name] = data
        view = memoryview(data)
        try:
            return load(cast(BinaryIO, ViewFile(view, name=str(path))))
        finally:
            view.release()


def _close(data: Buffer) -> None:
    if isinstance(data, mmap.mmap):
        try:
            data.close()
        except BufferError:  # something still holds a view: unmapped once it is gone
            pass

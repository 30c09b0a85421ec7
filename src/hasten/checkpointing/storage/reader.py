"""Reading a checkpoint's files: parallel verified block reads, tensors without a second copy.

Each file is read once, by several threads at a time (one block each), and every block is hashed
right after it is read, while it is still in cache. Large files go straight to where their
tensors will live (`hasten.checkpointing.storage.scatter`); the rest, and files bound for another
device, go whole into fresh host memory and are handed on only once every block matches.
Tensors are views of that memory (safetensors through `tensors_from_safetensors`, pickles
through `unpickle_buffer`): no second copy. Every load reads on the process's one pool of I/O
threads (`hasten.checkpointing.storage.threads.io_threads`), started on first use.
"""

from __future__ import annotations

import functools
import io
import mmap
import os
import pickle
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, wait
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import torch

from hasten.checkpointing.storage.checksum import block_digest
from hasten.checkpointing.storage.io import in_place_loader, load, refuse_unsafe
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, FileRecord
from hasten.checkpointing.storage.plain_pickle import PLAIN_PICKLE
from hasten.checkpointing.storage.scatter import check_blocks, place_tensors, submit_blocks
from hasten.checkpointing.storage.tensors import tensors_from_safetensors
from hasten.checkpointing.storage.threads import io_threads

__all__ = [
    "Buffer",
    "CheckpointReader",
    "PendingRead",
    "host_buffer",
    "map_verified",
    "read_verified",
    "unpickle_buffer",
]

Buffer = bytearray | mmap.mmap

# Files smaller than this go to a plain bytearray rather than a mapping of their own.
_SMALL_BYTES = 1 << 20
# Blocks read without a manifest (strict=False), so large files are still read in parallel.
_UNVERIFIED_BLOCK_BYTES = 16 << 20


def host_buffer(nbytes: int) -> Buffer:
    """Writable zeroed host memory of ``nbytes``.

    Large buffers are private anonymous mappings of their own, returned to the system as soon
    as nothing (no tensor view) refers to them any more, rather than heap memory that stays with
    the process. They use ordinary pages: transparent huge pages (``MADV_HUGEPAGE``) made fresh
    loads 2-5x faster in some runs here and 2-3x slower in others (direct compaction, and a
    host that backs the guest's huge pages lazily), so the steadier choice was kept.
    """
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if nbytes < _SMALL_BYTES or not flags:
        return bytearray(nbytes)
    return mmap.mmap(-1, nbytes, flags=flags)


def _expected(
    path: Path, name: str, size: int, manifest: dict[str, Any] | None
) -> FileRecord | None:
    if manifest is None:
        return None
    record: FileRecord | None = manifest["files"].get(name)
    if record is None:
        raise CorruptCheckpointError(f"{path} is not listed in the checkpoint manifest.")
    blocks = -(-size // manifest["block_bytes"])
    if record.size != size or len(record.blocks) != blocks:
        raise CorruptCheckpointError(
            f"{path} is truncated or damaged: {size} bytes, the manifest says {record.size}. "
            "Load an earlier checkpoint."
        )
    return record


def read_verified(
    folder: Path,
    name: str,
    manifest: dict[str, Any] | None,
    pool: Executor | None = None,
) -> Buffer:
    """Read ``folder/name`` whole into fresh host memory, checking every block's checksum.

    With ``pool`` the blocks are read and hashed on its threads in parallel. Without a manifest
    (non-strict loading) the file is read unverified.

    Raises:
        CorruptCheckpointError: the file is not in the manifest, has the wrong size, or a block
            does not match (the message names the file).
    """
    path = folder / name
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        expected = _expected(path, name, size, manifest)
        buffer = host_buffer(size)
        view = memoryview(buffer)
        try:
            blocks = submit_blocks(
                handle.fileno(), path, size, [(0, view)], _block_bytes(manifest), expected, pool
            )
            check_blocks(path, blocks)
        finally:
            view.release()
    return buffer


def map_verified(
    folder: Path, name: str, manifest: dict[str, Any], pool: Executor | None = None
) -> Buffer:
    """Map ``folder/name`` read-only and check every block's checksum straight from the map.

    The file is read once, into the page cache, and the map then serves whoever parses it (for
    an engine's ``torch.load``) without a private copy of the bytes. With ``pool`` the blocks
    are hashed on its threads in parallel. Close the map when done.

    Raises:
        CorruptCheckpointError: the file is not in the manifest, has the wrong size, or a block
            does not match (the message names the file).
    """
    path = folder / name
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        expected = _expected(path, name, size, manifest)
        if size == 0:
            return bytearray()
        mapping = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
    try:
        if hasattr(mmap, "MADV_WILLNEED"):
            mapping.madvise(mmap.MADV_WILLNEED)  # read ahead while the first blocks hash
        if expected is not None:
            _check_mapped(path, mapping, int(manifest["block_bytes"]), expected, pool)
    except BaseException:
        mapping.close()
        raise
    return mapping


def _check_mapped(
    path: Path, data: mmap.mmap, block_bytes: int, expected: FileRecord, pool: Executor | None
) -> None:
    view = memoryview(data)

    def matches(index: int) -> bool:
        block = view[index * block_bytes : (index + 1) * block_bytes]
        return block_digest(block) == expected.blocks[index]

    try:
        count = len(expected.blocks)
        if pool is None or count < 2:
            blocks: list[Future[bool]] = [Future() for _ in range(count)]
            for index, block in enumerate(blocks):
                block.set_result(matches(index))
        else:
            blocks = [pool.submit(matches, index) for index in range(count)]
        check_blocks(path, blocks)
    finally:
        view.release()


def _block_bytes(manifest: dict[str, Any] | None) -> int:
    """The block size a file is read (and, with a manifest, verified) in."""
    return _UNVERIFIED_BLOCK_BYTES if manifest is None else int(manifest["block_bytes"])


_ZIP_MAGIC = b"PK\x03\x04"


def unpickle_buffer(
    buffer: Buffer, map_location: str | torch.device | None = None, source: object = None
) -> Any:
    """``torch.load(weights_only=True)`` of a file held in ``buffer``, without copying tensors.

    CPU tensors come back as views of ``buffer`` (which they keep alive); other locations get
    copies, as with ``torch.load``. Plain data, tensors and numpy arrays are unpickled by the C
    unpickler (`PLAIN_PICKLE`); a file holding anything else goes to torch's ``weights_only``
    unpickler, which allows a few more torch types. Files torch's zip loader cannot take (the
    legacy format) are loaded the ordinary way.

    Raises:
        UnsafeCheckpointError: the pickle needs types beyond tensors, plain data and numpy arrays.
    """
    loader = in_place_loader()
    weights_only = getattr(torch.serialization, "_weights_only_unpickler", None)
    zipped = len(buffer) >= len(_ZIP_MAGIC) and buffer[:4] == _ZIP_MAGIC
    if loader is None or weights_only is None or not zipped:
        return load(io.BytesIO(buffer), map_location=map_location)
    view, storage = (
        memoryview(buffer),
        torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage(),
    )
    try:
        loaded = loader(view, storage, map_location, PLAIN_PICKLE)
    except pickle.UnpicklingError:  # more than plain data: torch's unpickler decides
        with refuse_unsafe(source if source is not None else "a checkpoint file"):
            loaded = loader(view, storage, map_location, weights_only)
    # None: another byte order (or a pickled None), decoded from a copy
    return load(io.BytesIO(buffer), map_location=map_location) if loaded is None else loaded


class _Tasks(Executor):
    """The shared I/O threads as one reader uses them: it waits for its own tasks at the end."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._futures: list[Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = self._pool.submit(fn, *args, **kwargs)
        self._futures.append(future)
        return future

    def wait(self) -> None:
        """Wait for every task this reader queued (their files may close after)."""
        futures, self._futures = self._futures, []
        wait(futures)


class PendingRead:
    """A file being loaded on the reader's threads; `result` waits, checks and returns it."""

    def __init__(self, value: Any, finish: Callable[[], None] | None = None) -> None:
        self._value = value
        self._finish = finish

    def result(self) -> Any:
        """The loaded object, once every block is read and matches the manifest.

        Raises:
            CorruptCheckpointError: a block did not match (naming the file and block).
        """
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()
        return self._value


class CheckpointReader:
    """The files of one checkpoint folder, read in parallel and verified against its manifest.

    Use it as a context manager: leaving it waits for the blocks it queued on the I/O threads
    (`io_threads`) and closes its files. The ``start_*`` methods return as soon as a large
    file is parsed and its blocks are queued, so the caller can parse the next file while the
    threads read this one.
    """

    def __init__(self, folder: Path, manifest: dict[str, Any] | None) -> None:
        self.folder = folder
        self.manifest = manifest
        self._pool = _Tasks(io_threads())
        self._open: list[BinaryIO] = []

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._pool.wait()  # reads still queued finish before their files close
        for handle in self._open:
            handle.close()

    def exists(self, name: str) -> bool:
        """Whether the checkpoint has a file ``name``."""
        return (self.folder / name).is_file()

    def read(self, name: str) -> Buffer:
        """The verified bytes of ``name``."""
        return read_verified(self.folder, name, self.manifest, self._pool)

    def tensors(
        self, name: str, like: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """The tensors of the safetensors file ``name``, verified (see `start_tensors`)."""
        tensors: dict[str, torch.Tensor] = self.start_tensors(name, like).result()
        return tensors

    def unpickle(
        self, name: str, map_location: str | torch.device | None = None, like: Any = None
    ) -> Any:
        """The object in the pickle ``name``, loaded safely (see `start_unpickle`)."""
        return self.start_unpickle(name, map_location, like).result()

    def start_tensors(
        self,
        name: str,
        like: Mapping[str, torch.Tensor] | None = None,
        check: Callable[[dict[str, torch.Tensor]], None] | None = None,
    ) -> PendingRead:
        """Start loading the safetensors file ``name``.

        Large files are read straight into ``like``'s matching tensors (reused, as a model's
        parameters) or into fresh host memory (see `hasten.checkpointing.storage.scatter`).
        ``check`` sees the tensors (names, shapes, dtypes) before any data is read into place;
        an exception it raises leaves ``like`` untouched.
        """
        if self._small(name):
            tensors = tensors_from_safetensors(self.read(name))
            if check is not None:
                check(tensors)
            return PendingRead(tensors)
        return self._scatter(name, tensors_from_safetensors, like, check)

    def start_unpickle(
        self,
        name: str,
        map_location: str | torch.device | None = None,
        like: Any = None,
        check: Callable[[Any], None] | None = None,
    ) -> PendingRead:
        """Start loading the pickle ``name`` safely (see `unpickle_buffer`).

        Like `start_tensors`, large files bound for the CPU go straight into ``like``'s tensors
        or fresh memory; other locations get a verified copy moved there.
        """
        source = str(self.folder / name)
        on_cpu = map_location is None or torch.device(map_location).type == "cpu"
        if self._small(name) or not on_cpu or in_place_loader() is None:
            value = unpickle_buffer(self.read(name), map_location, source=source)
            if check is not None:
                check(value)
            return PendingRead(value)
        parse = functools.partial(unpickle_buffer, map_location=None, source=source)
        return self._scatter(name, parse, like, check)

    def _small(self, name: str) -> bool:
        return (self.folder / name).stat().st_size < _SMALL_BYTES

    def _scatter(
        self,
        name: str,
        parse: Callable[[Any], Any],
        like: Any,
        check: Callable[[Any], None] | None,
    ) -> PendingRead:
        path = self.folder / name
        handle = open(path, "rb", buffering=0)  # noqa: SIM115 - closed with the reader
        self._open.append(handle)
        size = os.fstat(handle.fileno()).st_size
        expected = _expected(path, name, size, self.manifest)
        mapping = mmap.mmap(
            handle.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
        try:
            parsed = parse(mapping)  # reads only the headers: the tensors stay untouched
        except CorruptCheckpointError:
            raise
        except Exception:
            self.read(name)  # a damaged file is reported as such
            raise
        if check is not None:
            check(parsed)
        placement = place_tensors(parsed, like, mapping, host_buffer)
        del parsed
        if placement is None:
            return PendingRead(parse(self.read(name)))
        blocks = submit_blocks(
            handle.fileno(),
            path,
            size,
            placement.pieces,
            _block_bytes(self.manifest),
            expected,
            self._pool,
        )
        return PendingRead(placement.result, lambda: check_blocks(path, blocks))

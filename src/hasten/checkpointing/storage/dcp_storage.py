"""DCP storage for the sharded parts of a checkpoint: one DCP call, one folder per part, no re-reads.

A save_state checkpoint keeps every model and optimizer in its own DCP folder, Accelerate's
``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/``, each a complete DCP checkpoint that plain
``dcp.load`` (or Accelerate) reads. Saving them with one DCP call per part would plan and
synchronise once per part; here one call covers all of them. The state dict handed to DCP is
``{part: state_dict}``, so every DCP key starts with its part's folder name:

- `PartedWriter` writes each part's items into that part's folder (``__<rank>_0.distcp``, one
  file per part and process, as DCP names them), hashes every block while the bytes go to the
  file (no second pass over them), and on the coordinator writes one ``.metadata`` per part,
  the keys without the part prefix: exactly what a separate DCP save of that part would write.
- `PartedReader` merges the parts' ``.metadata`` files back into one, so one DCP load fills every
  model and optimizer. With a manifest it verifies while reading: each file has one verifying
  process (the one that wrote it, so with unchanged sharding the one that reads it), which maps
  it and checks its block checksums while DCP plans, then decodes its items from the mapping:
  each tensor is a view of the mapped bytes, so its data is copied once, into the state dict
  (DCP's reader copies it twice: out of the file, then into place). A damaged file fails that
  planning step, which DCP reports to every process before any tensor is filled: refused
  everywhere, with nothing loaded into the model.

This module imports ``torch.distributed.checkpoint``; import it only when a sharded part is
saved or loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import mmap
import os
import pickle
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

from hasten.checkpointing.storage import checksum
from hasten.checkpointing.storage.dcp_safe import (
    SafeFileSystemReader,
    load_metadata,
    load_tensor_item,
)
from hasten.checkpointing.storage.io import EarlyWriteback, ViewFile, fsync_directory
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, FileRecord
from hasten.checkpointing.storage.reader import map_verified
from hasten.checkpointing.storage.threads import io_threads

__all__ = [
    "METADATA_NAME",
    "PartedReader",
    "PartedWriter",
    "in_folder",
    "part_of",
    "read_part_metadata",
]

METADATA_NAME = ".metadata"  # DCP's name for a checkpoint's index
_DCP_VERSION = "1.0.0"  # DCP's CURRENT_DCP_VERSION when the index format was last changed


def part_of(fqn: str) -> tuple[str, str]:
    """``(part, key)`` of a combined DCP key ``"<part>.<key>"``."""
    part, _, key = fqn.partition(".")
    return part, key


def in_folder(folder: str, name: str) -> str:
    """``name`` inside the relative ``folder`` ("" for the root itself)."""
    return f"{folder}/{name}" if folder else name


class _HashingStream(io.RawIOBase):
    """A new file that hashes each block of what is written, as it is written."""

    def __init__(self, handle: Any, name: str, block_bytes: int) -> None:
        super().__init__()
        self._handle = handle
        self._out = EarlyWriteback(handle)
        self._hasher = checksum.BlockHasher(block_bytes)
        self.name_in_checkpoint = name

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hasher.update(view)
        self._out.write(view)
        return view.nbytes

    def tell(self) -> int:
        return self._hasher.size

    def flush(self) -> None:
        self._handle.flush()

    def fileno(self) -> int:
        return int(self._handle.fileno())

    def record(self) -> FileRecord:
        """Size and block digests of everything written."""
        return FileRecord(self.name_in_checkpoint, self._hasher.size, tuple(self._hasher.digests()))


class _HashingFileSystem(FileSystem):
    """DCP's local file system whose new files are hashed while written (see `PartedWriter`)."""

    def __init__(self, root: Path, block_bytes: int) -> None:
        super().__init__()
        self.root = root
        self.block_bytes = block_bytes
        self.records: list[FileRecord] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        target = Path(path)
        name = target.relative_to(self.root).as_posix()
        with open(target, "wb") as handle:
            stream = _HashingStream(handle, name, self.block_bytes)
            yield stream
            handle.flush()
        with self._lock:
            self.records.append(stream.record())


@dataclasses.dataclass(frozen=True)
class _Records:
    """One process's file records, travelling to the coordinator with DCP's write results."""

    records: tuple[FileRecord, ...]


class PartedWriter(FileSystemWriter):
    """Writes a ``{part: state_dict}`` DCP save as one DCP checkpoint per part folder of ``root``.

    Every process's files are hashed while written; `records` lists them relative to ``root``.
    ``also`` (optional) writes this process's other checkpoint files at the same time, on its
    own thread, returning their records. The coordinator also learns every process's records
    through DCP's exchange of write results: `all_records` (with each part's ``.metadata``).
    ``folders`` maps a part to its folder relative to ``root`` ("" for ``root`` itself, a lone
    DCP checkpoint; by default the part's name). The part folders must exist.
    """

    def __init__(
        self,
        root: Path,
        parts: Sequence[str],
        block_bytes: int | None = None,
        also: Callable[[], list[FileRecord]] | None = None,
        folders: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(root, sync_files=True)
        self.root = root
        self.parts = list(parts)
        self.folders = {part: (folders or {}).get(part, part) for part in self.parts}
        self._fs = _HashingFileSystem(root, block_bytes or checksum.BLOCK_BYTES)
        self.fs = self._fs
        self._also = also
        self._also_records: list[FileRecord] = []
        self.all_records: list[FileRecord] = []

    @property
    def records(self) -> list[FileRecord]:
        """What this process wrote: sizes and block digests, names relative to ``root``."""
        return [*self._fs.records, *self._also_records]

    def prepare_local_plan(self, plan: Any) -> Any:
        # The part folders already exist in a fresh staging folder: no check for an older
        # checkpoint to overwrite (DCP's), and no process creates folders beside the main one.
        return plan

    def _part_writer(self, part: str) -> FileSystemWriter:
        writer = FileSystemWriter(self.root / self.folders[part], sync_files=self.sync_files)
        writer.fs = self._fs
        return writer

    def write_data(self, plan: Any, planner: Any) -> Future[list[Any]]:
        by_part: dict[str, list[Any]] = {part: [] for part in self.parts}
        for item in plan.items:
            part = part_of(item.index.fqn)[0]
            if part not in by_part:
                raise ValueError(f"DCP item {item.index.fqn!r} belongs to no part of {self.parts}")
            by_part[part].append(item)

        def write(part: str) -> list[Any]:
            sub = dataclasses.replace(plan, items=by_part[part])
            return list(self._part_writer(part).write_data(sub, planner).value())

        # one file per part and process on the I/O threads, the other files meanwhile from
        # here (large writes and fsyncs release the GIL; concurrent fsyncs share the file
        # system's journal commits)
        writes = [io_threads().submit(write, part) for part in self.parts]
        if self._also is not None:
            self._also_records = list(self._also())
        results: list[Any] = [r for future in writes for r in future.result()]
        done: Future[list[Any]] = Future()
        done.set_result([*results, _Records(tuple(self.records))])
        return done

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        """On the coordinator: one ``.metadata`` per part, keys without the part prefix."""
        gathered = [r for chunk in results for r in chunk if isinstance(r, _Records)]
        results = [[r for r in chunk if not isinstance(r, _Records)] for chunk in results]
        parts = {
            part: _empty_metadata(self.root / self.folders[part], self.save_id)
            for part in self.parts
        }
        for fqn, item in metadata.state_dict_metadata.items():
            part, key = part_of(fqn)
            parts[part].state_dict_metadata[key] = item
        if isinstance(metadata.planner_data, dict):
            for fqn, path in metadata.planner_data.items():
                part, key = part_of(fqn)
                parts[part].planner_data[key] = tuple(path)[1:]
        for result in (r for chunk in results for r in chunk):
            part, key = part_of(result.index.fqn)
            index = MetadataIndex(key, result.index.offset, result.index.index)
            parts[part].storage_data[index] = result.storage_data
        written = list(io_threads().map(self._write_index, parts.items()))
        self.all_records = [r for g in gathered for r in g.records] + written

    def _write_index(self, item: tuple[str, Metadata]) -> FileRecord:
        part, part_metadata = item
        data = pickle.dumps(part_metadata)
        folder = self.folders[part]
        name = in_folder(folder, METADATA_NAME)
        with open(self.root / name, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_directory(self.root / folder)  # every process's file names in it are durable
        digests = checksum.block_digests(data, self._fs.block_bytes)
        return FileRecord(name, len(data), tuple(digests))


def _empty_metadata(folder: Path, save_id: str) -> Metadata:
    return Metadata(
        state_dict_metadata={},
        planner_data={},
        storage_data={},
        storage_meta=StorageMeta(checkpoint_id=str(folder), save_id=save_id),
        version=_DCP_VERSION,
    )


def read_part_metadata(folder: Path, part: str, manifest: dict[str, Any] | None) -> Metadata:
    """The ``.metadata`` of ``folder/part`` (``part`` "": ``folder`` itself), checked against
    the manifest when there is one.

    Raises:
        CorruptCheckpointError: the manifest lists no ``.metadata`` for the part, or it is damaged.
        UnsafeCheckpointError: it holds objects beyond DCP's index types (see `dcp_safe`).
    """
    name = in_folder(part, METADATA_NAME)
    path = folder / name
    if manifest is not None and name not in manifest["files"]:
        raise CorruptCheckpointError(
            f"{folder / part} is not a complete sharded checkpoint part: the manifest lists no "
            f"{METADATA_NAME} for it. Load an earlier checkpoint."
        )
    data = path.read_bytes()
    if manifest is not None:
        block = int(manifest.get("block_bytes", checksum.BLOCK_BYTES))
        if tuple(checksum.block_digests(data, block)) != manifest["files"][name].blocks:
            raise _damaged(path)
    return load_metadata(data, path)


def _damaged(path: Path) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{path} is damaged (its checksums differ from the manifest). Load an earlier checkpoint."
    )


def _merged(parts: dict[str, Metadata], folders: Mapping[str, str]) -> Metadata:
    """One DCP index over every part, keys prefixed by the part, file names by its folder."""
    merged = Metadata(state_dict_metadata={}, planner_data={}, storage_data={})
    for part, metadata in parts.items():
        merged.storage_meta = merged.storage_meta or metadata.storage_meta
        merged.version = merged.version or metadata.version
        for key, item in metadata.state_dict_metadata.items():
            merged.state_dict_metadata[f"{part}.{key}"] = item
        for key, path in (metadata.planner_data or {}).items():
            merged.planner_data[f"{part}.{key}"] = (part, *tuple(path))
        prefix = in_folder(folders[part], "")  # "<folder>/", or "" for the root itself
        for index, info in (metadata.storage_data or {}).items():
            combined = MetadataIndex(f"{part}.{index.fqn}", index.offset, index.index)
            where = f"{prefix}{info.relative_path}"
            merged.storage_data[combined] = dataclasses.replace(info, relative_path=where)
    return merged


class _VerifiedFileSystem(FileSystem):
    """DCP's local file system serving the files this process verified from their mappings."""

    def __init__(self) -> None:
        super().__init__()
        self.verified: dict[str, memoryview] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        view = self.verified.get(os.fspath(path)) if mode == "rb" else None
        if view is None:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        yield ViewFile(view)  # each item is then served alone, see PartedReader._slice_file


_COPY_ITEM_BYTES = 1 << 20  # items under this size are copied out whole (see _slice_file)
_SAVER_RANK = re.compile(r"^__(\d+)_\d+\.distcp$")


def _owner(name: str, index: int, world_size: int) -> int:
    """The process that verifies file ``name`` (``index``: its place among the part files).

    The process that wrote it, when there is one of that number: with unchanged sharding it is
    the one that reads the file anyway. Decided without any exchange, so verifying happens in
    DCP's local planning and a failure reaches every process through DCP's planning exchange.
    """
    match = _SAVER_RANK.match(name.rsplit("/", 1)[-1])
    return (int(match.group(1)) if match else index) % world_size


class PartedReader(SafeFileSystemReader):
    """Reads every part folder of ``root`` in one DCP load of a ``{part: state_dict}``.

    With a ``manifest``, every file of the parts is verified by one process (`_owner`): mapped
    and checked on the I/O threads from construction on (while DCP plans), then served from
    the mapping. DCP's local planning step waits for the checks, so a damaged file fails the
    planning on that process, which DCP reports to every process before any tensor is filled.
    ``rank`` and ``world_size`` are this process's among the processes loading; ``folders``
    maps parts to folders as for `PartedWriter`.
    """

    def __init__(
        self,
        root: Path,
        parts: Sequence[str],
        manifest: dict[str, Any] | None,
        *,
        rank: int = 0,
        world_size: int = 1,
        folders: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(root)
        self.root = root
        self.parts = list(parts)
        self.folders = {part: (folders or {}).get(part, part) for part in self.parts}
        self.manifest = manifest
        self._fs = _VerifiedFileSystem()
        self.fs = self._fs
        self._maps: list[mmap.mmap] = []
        self._names: list[str] = []
        self._checks: list[Any] = []
        indexes = {p: read_part_metadata(root, self.folders[p], manifest) for p in self.parts}
        self._metadata = _merged(indexes, self.folders)
        if manifest is not None:
            prefixes = tuple(in_folder(folder, "") for folder in self.folders.values())
            indexes_names = {in_folder(folder, METADATA_NAME) for folder in self.folders.values()}
            self._names = sorted(
                n for n in manifest["files"] if n.startswith(prefixes) and n not in indexes_names
            )
            mine = [n for i, n in enumerate(self._names) if _owner(n, i, world_size) == rank]
            self._checks = [io_threads().submit(self._check, name) for name in mine]

    @property
    def metadata(self) -> Metadata:
        """Every part's index merged, keys prefixed with the part's folder name."""
        return self._metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._metadata

    def prepare_local_plan(self, plan: Any) -> Any:
        """Wait for the checks of the files this process owns (all of them when alone)."""
        if self.manifest is None:
            return plan
        try:
            needed = {info.relative_path for info in self.storage_data.values()}
            unlisted = sorted(needed - set(self._names))
            if unlisted:
                raise CorruptCheckpointError(
                    f"{self.root / unlisted[0]} is read by the checkpoint's index but not "
                    "listed in its manifest. Load an earlier checkpoint."
                )
            checks, self._checks = self._checks, []
            self._fs.verified.update(check.result() for check in checks)
        except BaseException:
            self.close()
            raise
        return plan

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        """One item of a file DCP reads: a small one as a BytesIO of its bytes (read by C).

        DCP's own slice is a Python view over the file stream, whose seek/tell/readinto run
        dozens of times per item (the zip headers); a copy of a small item costs less. (Items
        of verified files are decoded from their mappings instead, see `_read_mapped`.)
        """
        small = sinfo.length < _COPY_ITEM_BYTES
        if isinstance(file, ViewFile):
            view = file.view[sinfo.offset : sinfo.offset + sinfo.length]
            return io.BytesIO(view) if small else ViewFile(view)
        if small:
            file.seek(sinfo.offset)
            return io.BytesIO(file.read(sinfo.length))
        return super()._slice_file(file, sinfo)

    def read_data(self, plan: Any, planner: Any) -> Future[None]:
        """Fill the plan's items: from the verified mappings here, the others by DCP's reader."""
        try:
            by_file: dict[str, list[Any]] = {}
            rest = []
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                path = os.fspath(self.root / info.relative_path)
                if path in self._fs.verified and not info.transform_descriptors:
                    by_file.setdefault(path, []).append(item)
                else:
                    rest.append(item)
            for path, items in by_file.items():
                self._read_mapped(self._fs.verified[path], items, planner)
            if rest or not by_file:
                return super().read_data(dataclasses.replace(plan, items=rest), planner)
            done: Future[None] = Future()
            done.set_result(None)
            return done
        finally:
            self.close()

    def _read_mapped(self, view: memoryview, items: list[Any], planner: Any) -> None:
        """Load ``items`` of one mapped file in file order, each tensor's data copied just once."""
        with warnings.catch_warnings():  # the mapping is read-only; only ever copied from
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
        infos = [self.storage_data[item.storage_index] for item in items]
        for info, item in sorted(zip(infos, items), key=lambda pair: pair[0].offset):
            start, end = info.offset, info.offset + info.length
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(view[start:end]))
                continue
            tensor = load_tensor_item(view[start:end], storage[start:end])
            tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            if target.size() != tensor.size():
                raise ValueError(
                    f"{item.storage_index.fqn} is {tuple(tensor.size())} in the checkpoint, "
                    f"{tuple(target.size())} here"
                )
            target.copy_(tensor)
            planner.commit_tensor(item, target)

    def close(self) -> None:
        """Drop the mappings of the verified files (after reading, or when the load failed)."""
        for check in self._checks:  # a load that failed before its planning
            with contextlib.suppress(Exception):
                check.result()
        self._checks = []
        for view in self._fs.verified.values():
            with contextlib.suppress(BufferError):
                view.release()
        self._fs.verified.clear()
        for mapped in self._maps:
            with contextlib.suppress(BufferError):  # a view still alive: closed when freed
                mapped.close()
        self._maps = []

    def _check(self, name: str) -> tuple[str, memoryview]:
        """Map ``name`` and compare its block checksums with the manifest's (see `map_verified`)."""
        assert self.manifest is not None
        mapped = map_verified(self.root, name, self.manifest)
        if isinstance(mapped, mmap.mmap):  # (an empty file cannot be mapped)
            self._maps.append(mapped)
        return os.fspath(self.root / name), memoryview(mapped)

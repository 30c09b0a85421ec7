"""Reading DCP checkpoints without running code from them: a restricted index, safe byte entries.

DCP itself unpickles each ``.metadata`` with plain ``pickle`` and loads non-tensor entries
("bytes" items: learning rates, step counts, parameter names) with
``torch.load(weights_only=False)``, so a crafted checkpoint could run code on load. Every DCP
read in hasten goes through here instead:

- `load_metadata` unpickles an index allowing only what DCP's index is made of (its metadata
  dataclasses, torch sizes, dtypes, layouts and memory formats, paths, plain containers);
- `SafeLoadPlanner` loads bytes entries (``torch.save`` blobs) allowing only plain data and
  tensors -- ``weights_only=True``'s guarantee, through the C unpickler, so faster than DCP's
  own ``weights_only=False`` load rather than slower. It also keeps DCP's pre-2.4 fallback
  away from indexes that carry a format version (see `SafeLoadPlanner.create_local_plan`);
- `SafeFileSystemReader` is DCP's file-system reader with that index reader (the DCP calls
  themselves are in `hasten.checkpointing.storage.dcp`);
- `load_tensor_item` decodes a tensor entry held in memory (a mapped file) without copying its
  data, through the same restricted C unpickler; what it does not recognise goes to
  ``torch.load(weights_only=True)``, DCP's own decoder for tensor entries.

Anything else is refused with `UnsafeCheckpointError` before it is constructed. Import this
module only when a DCP checkpoint is read (it imports ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import create_default_local_load_plan
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan

from hasten.checkpointing.storage.io import UnsafeCheckpointError, in_place_loader
from hasten.checkpointing.storage.plain_pickle import (
    PLAIN_GLOBALS,
    PLAIN_PICKLE,
    RestrictedUnpickler,
)

__all__ = [
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "load_metadata",
    "load_tensor_item",
]

_TRUST_HINT = (
    "If you created or trust this checkpoint, load it with torch.distributed.checkpoint.load "
    "yourself (which unpickles anything)."
)

# What a DCP index pickles to (checked on FSDP1/FSDP2 model+AdamW and plain one-process saves)
_INDEX_GLOBALS = PLAIN_GLOBALS | {
    *(
        f"torch.distributed.checkpoint.metadata.{name}"
        for name in (
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.serialization._get_layout",  # a layout from its name
    *(f"pathlib.{name}" for name in ("Path", "PosixPath", "PurePath", "PurePosixPath")),
    "pathlib.PureWindowsPath",
}


class _IndexUnpickler(RestrictedUnpickler):
    """Unpickles a DCP index, refusing every global but its own classes and plain data."""

    def allowed(self) -> frozenset[str]:
        return _INDEX_GLOBALS

    def refusal(self, name: str) -> UnsafeCheckpointError:
        return UnsafeCheckpointError(
            f"Refused to load {self.source}: the DCP index holds {name}, which hasten does not "
            "unpickle (a DCP .metadata holds only DCP's index classes, torch sizes and dtypes, "
            f"and plain data; other objects could run code when loaded). {_TRUST_HINT}"
        )


def load_metadata(data: bytes, source: object) -> Metadata:
    """The DCP index pickled in ``data`` (read from ``source``), with nothing but its own types.

    Raises:
        UnsafeCheckpointError: it holds another type (named), or is not a DCP index.
    """
    unpickler = _IndexUnpickler(io.BytesIO(data))
    unpickler.source = source
    try:
        loaded = unpickler.load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unpickling failure: a damaged index
        raise UnsafeCheckpointError(
            f"Refused to load {source}: its DCP index cannot be read ({exc!r})."
        ) from exc
    if not isinstance(loaded, dcp_metadata.Metadata):
        raise UnsafeCheckpointError(
            f"Refused to load {source}: it holds a {type(loaded).__name__}, not a DCP index."
        )
    return loaded


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor entries with only plain data allowed."""

    def create_local_plan(self) -> LoadPlan:
        """DCP's plan, without its pre-2.4 fallback for an index that has a format version.

        When the index holds keys the flattened state dict lacks, DCP assumes a checkpoint from
        torch < 2.4 and flattens the state dict the old way, where an optimizer's
        ``param_groups`` is one entry: ``Missing key in checkpoint state_dict:
        <part>.param_groups``. But a process lacks keys for another reason too: FSDP1's
        sharded state dicts are ShardedTensors, and DCP drops those of which this process holds
        no chunk (a parameter with fewer rows than processes). DCP records a format version in
        its index only since after that change (hasten's indexes always carry one), so for a
        versioned index the fallback never applies: the keys this process lacks are simply not
        read here, as DCP does when no old layout is suspected.
        """
        if not self.flatten_state_dict or self.metadata is None or self.metadata.version is None:
            return super().create_local_plan()
        return create_default_local_load_plan(
            self.state_dict, self.metadata, not self.allow_partial_load
        )

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        fqn = read_item.dest_index.fqn
        try:  # weights_only=False with a restricted C unpickler: weights_only's is pure Python
            loaded = torch.load(value, weights_only=False, pickle_module=PLAIN_PICKLE)
        except pickle.UnpicklingError as exc:  # UnsafeCheckpointError included
            raise UnsafeCheckpointError(
                f"Refused to load the checkpoint entry {fqn!r}: it holds objects beyond plain "
                f"data and tensors, which could run code when unpickled. {_TRUST_HINT}"
            ) from exc
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def load_tensor_item(view: memoryview, storage: torch.UntypedStorage) -> torch.Tensor:
    """The tensor of a DCP tensor entry (a ``torch.save`` archive) held in ``view``.

    ``storage`` is the same bytes as a torch storage (a slice of a mapped file's): the tensor is
    a view of it, so its data is copied once, into the state dict, not twice as DCP's reader
    does. An archive in another byte order or holding more than a plain tensor is decoded by
    ``torch.load(weights_only=True)`` from a copy, as DCP decodes every tensor entry.
    """
    load = in_place_loader()
    if load is not None:
        try:
            tensor = load(view, storage, "cpu", PLAIN_PICKLE)  # None: another byte order
        except pickle.UnpicklingError:
            tensor = None  # not a plain tensor: torch's weights_only decoder decides
        if isinstance(tensor, torch.Tensor):
            return tensor
    return torch.load(io.BytesIO(view), map_location="cpu", weights_only=True)


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader whose index is read by `load_metadata` (once: DCP asks again)."""

    _index: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        if rank is None and self._index is not None:
            return self._index
        path = self._get_metadata_path(rank)
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_metadata(stream.read(), path)
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        if rank is None:
            self._index = metadata
        return metadata

"""Writing and reading checkpoint files: atomic writes, safetensors by default, safe loading.

Nothing loaded here can execute code: tensors come back through safetensors or through
``torch.load(weights_only=True)`` with only the numpy types that RNG states need allow-listed.
Loading an arbitrary pickle requires ``weights_only=False`` explicitly, and warns.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import io
import os
import pickle
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch

from hasten.checkpointing.storage.tensors import clean_state_dict_for_safetensors
from hasten.state import PartialState

__all__ = [
    "EarlyWriteback",
    "TORCH_SAFE_GLOBALS",  # noqa: F822 - built on first use by the module __getattr__
    "UnsafeCheckpointError",
    "ViewFile",
    "atomic_write",
    "fsync_directory",
    "fsync_path",
    "in_place_loader",
    "is_safetensors_file",
    "load",
    "refuse_unsafe",
    "safe_globals",
    "save",
]

_SAFETENSORS_SUFFIX = ".safetensors"


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint needs more than tensors and plain data to load, so it was refused."""


_SAFE_GLOBALS: list[Any] = []


def safe_globals() -> list[Any]:
    """The extra types allowed during a ``weights_only`` load: what numpy RNG states pickle to.

    One list per process, built on first use; it is also ``TORCH_SAFE_GLOBALS``, so what a user
    appends there is allowed by every later `load`.
    """
    if not _SAFE_GLOBALS:
        import numpy as np

        core = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core to np._core
        allowed: list[Any] = [core.multiarray._reconstruct, np.ndarray, np.dtype]
        allowed += [
            type(np.dtype(kind)) for kind in ("uint32", "int64", "float64", "float32", "bool")
        ]
        allowed += [np.uint32, np.int64, np.float64, np.float32, np.bool_]
        _SAFE_GLOBALS.extend(allowed)
    return _SAFE_GLOBALS


def __getattr__(name: str) -> Any:
    # TORCH_SAFE_GLOBALS (Accelerate's name) is built on first use: it needs numpy.
    if name == "TORCH_SAFE_GLOBALS":
        return safe_globals()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ViewFile(io.RawIOBase):
    """A read-only seekable file over bytes in memory (a buffer or a map), for torch's readers.

    DCP's readers and torch's zip reader take file objects; this one serves them from memory
    without a copy. ``name`` (the file's path, say) is what the object prints as, in messages.
    """

    def __init__(self, view: memoryview, name: str | None = None) -> None:
        super().__init__()
        self._view = view
        self._pos = 0
        self._name = name

    def __repr__(self) -> str:
        return self._name if self._name is not None else super().__repr__()

    @property
    def view(self) -> memoryview:
        """The bytes served."""
        return self._view

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        count = max(0, min(out.nbytes, self._view.nbytes - self._pos))
        out[:count] = self._view[self._pos : self._pos + count]
        self._pos += count
        return count

    def read(self, size: int | None = -1) -> bytes:
        end = self._view.nbytes if size is None or size < 0 else self._pos + size
        data = bytes(self._view[self._pos : min(end, self._view.nbytes)])
        self._pos += len(data)
        return data


_SMALL_ARCHIVE_BYTES = 1 << 20  # a smaller archive's index is parsed from a copy (C reads)
_NATIVE_ORDER = sys.byteorder.encode()


@functools.cache
def in_place_loader() -> Callable[[memoryview, torch.UntypedStorage, Any, Any], Any] | None:
    """A decoder of a ``torch.save`` archive in memory whose CPU tensors view its bytes, or None.

    ``run(view, storage, map_location, pickle_module)``: ``storage`` holds the same bytes as
    ``view``. It returns None for an archive in another byte order (torch would swap the bytes
    in place; they may be a read-only mapping): decode a copy of those. It is
    ``torch.serialization._load`` with ``overall_storage`` (what ``torch.load(mmap=True)`` uses,
    since torch 2.1): private, so checked once, not trusted.
    """
    loader = getattr(torch.serialization, "_load", None)
    reader = getattr(torch._C, "PyTorchFileReader", None)
    if loader is None or reader is None:
        return None
    try:
        if "overall_storage" not in inspect.signature(loader).parameters:
            return None
    except (TypeError, ValueError):
        return None

    def run(
        view: memoryview, storage: torch.UntypedStorage, map_location: Any, pickler: Any
    ) -> Any:
        # the zip index is read through many small reads: a C BytesIO copy beats Python callbacks
        source = io.BytesIO(view) if view.nbytes < _SMALL_ARCHIVE_BYTES else ViewFile(view)
        archive = reader(source)
        if archive.has_record("byteorder") and archive.get_record("byteorder") != _NATIVE_ORDER:
            return None
        return loader(archive, map_location, pickler, overall_storage=storage, encoding="utf-8")

    return run


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's data, or a directory's entries, to disk (the file or rename survives a power cut)."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_directory = fsync_path  # the name call sites use for folders: a rename inside is kept


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux only), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], function)


_SYNC_FILE_RANGE_WRITE = 2
# Writeback is started each time this much has been written since the last start.
_WRITEBACK_BYTES = 32 << 20


class EarlyWriteback:
    """A binary file wrapper that starts writing each 32 MiB to disk as soon as it is written.

    The kernel otherwise holds dirty pages until the final fsync, which then waits for the
    whole file; started early, the disk works while later bytes are still being produced and
    the fsync finds little left to do. Elsewhere than on Linux it only passes writes through.
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._start = _sync_file_range()
        self._written = 0
        self._synced = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` through, starting writeback when enough has accumulated."""
        count = self._handle.write(data)
        self._written += memoryview(data).nbytes
        if self._start is not None and self._written - self._synced >= _WRITEBACK_BYTES:
            self._handle.flush()
            # advisory: if the kernel declines, the final fsync writes these bytes instead
            self._start(
                self._handle.fileno(), self._synced, self._written - self._synced,
                _SYNC_FILE_RANGE_WRITE,
            )  # fmt: skip
            self._synced = self._written
        return count

    def flush(self) -> None:
        """Flush the underlying file."""
        self._handle.flush()

    def fileno(self) -> int:
        """The underlying file descriptor."""
        return self._handle.fileno()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[EarlyWriteback]:
    """Write ``path`` through a temporary file in the same folder, fsynced, then renamed in place.

    A crash at any moment leaves either the old file or the complete new one, never a torn file.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield EarlyWriteback(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_directory(target.parent)


def _should_write(save_on_each_node: bool) -> bool:
    state = PartialState()
    return state.is_local_main_process if save_on_each_node else state.is_main_process


def _tensor_dict(obj: Any) -> dict[str, torch.Tensor]:
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise TypeError(
            f"safe_serialization=True saves a flat dict of tensors, got {type(obj).__name__}. "
            "Pass a state dict of tensors, or use safe_serialization=False for other objects."
        )
    return {str(k): v.detach().contiguous() for k, v in obj.items()}


def save(
    obj: Any,
    f: str | os.PathLike[str],
    save_on_each_node: bool = False,
    safe_serialization: bool = False,
) -> None:
    """Save ``obj`` to ``f`` once per job (or once per node), atomically.

    Args:
        obj: the data to save; a flat dict of tensors when ``safe_serialization`` is set.
        f: the file to write.
        save_on_each_node: write on the local main process of every node instead of only on the
            global main process (for nodes that do not share a file system).
        safe_serialization: write safetensors instead of a pickle.
    """
    if not _should_write(save_on_each_node):
        return
    if safe_serialization:
        from safetensors.torch import save as save_bytes

        # tied weights are stored once (a copy of the dict is cleaned, with a warning naming
        # the dropped names), as Accelerate's save does
        tensors = clean_state_dict_for_safetensors(_tensor_dict(obj))
        payload = save_bytes(tensors, metadata={"format": "pt"})
        with atomic_write(f) as handle:
            handle.write(payload)
        return
    with atomic_write(f) as handle:
        torch.save(obj, cast(BinaryIO, handle))  # torch.save needs only ``write``


def is_safetensors_file(f: str | os.PathLike[str]) -> bool:
    """Whether ``f`` is a safetensors file (by suffix, else by its 8-byte header length)."""
    path = Path(f)
    if path.suffix == _SAFETENSORS_SUFFIX:
        return True
    with path.open("rb") as handle:
        head = handle.read(9)
    if len(head) < 9:
        return False
    header_len = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 0 < header_len < path.stat().st_size


def load(f: str | os.PathLike[str] | BinaryIO, map_location: Any = None, **kwargs: Any) -> Any:
    """Load what `save` wrote, refusing anything that could run code unless asked explicitly.

    Args:
        f: a file path or binary file object.
        map_location: where tensors go (as in ``torch.load``); for safetensors a device.
        **kwargs: passed to ``torch.load``. ``weights_only`` defaults to True; passing
            ``weights_only=False`` loads arbitrary pickles (only for files you trust) and warns.

    Raises:
        UnsafeCheckpointError: the pickle needs types beyond tensors, plain data and numpy
            arrays; the message says how to opt in.
    """
    if isinstance(f, (str, os.PathLike)) and is_safetensors_file(f):
        from safetensors.torch import load_file

        device = "cpu" if map_location is None else map_location
        return load_file(os.fspath(f), device=str(device))
    weights_only = kwargs.pop("weights_only", True)
    if not weights_only:
        warnings.warn(
            f"Loading {f!r} with weights_only=False: the file can run arbitrary code. Only do "
            "this for checkpoints you created or trust.",
            UserWarning,
            stacklevel=2,
        )
        return torch.load(f, map_location=map_location, weights_only=False, **kwargs)
    with refuse_unsafe(f):
        return torch.load(f, map_location=map_location, weights_only=True, **kwargs)


class _SharedAllowance:
    """One ``torch.serialization.safe_globals`` context shared by every load in flight.

    torch keeps the allow-list process-wide and each context restores it on exit, so two
    threads' overlapping contexts would end the allowance while the other still parses (its
    numpy RNG types then refused). Loads here count in and out: the first opens, the last closes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._context: Any = None

    def __enter__(self) -> None:
        with self._lock:
            if self._users == 0:
                self._context = torch.serialization.safe_globals(safe_globals())
                self._context.__enter__()
            self._users += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                context, self._context = self._context, None
                context.__exit__(None, None, None)


_SHARED_ALLOWANCE = _SharedAllowance()


@contextlib.contextmanager
def refuse_unsafe(source: object) -> Iterator[None]:
    """Run a ``weights_only`` unpickling with the numpy RNG types allowed; refuse anything more.

    Raises:
        UnsafeCheckpointError: the pickle needs other types; the message says how to opt in.
    """
    try:
        with _SHARED_ALLOWANCE:
            yield
    except pickle.UnpicklingError as exc:
        detail = str(exc).strip().splitlines()[-1][:300]
        raise UnsafeCheckpointError(
            f"Refused to load {source!r}: it contains objects beyond tensors, plain data and numpy "
            f"arrays, which could execute code when unpickled ({detail}). If you created or "
            "trust this file, load it with `load(f, weights_only=False)`."
        ) from exc

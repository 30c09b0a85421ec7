"""Reading a file's tensors straight into their final memory, verifying each block on the way.

Parsing a checkpoint file over a lazy memory map tells where every tensor's bytes lie in the
file without touching them. Each tensor then gets its destination: the matching tensor the
object already holds (an optimizer's state, a model's parameters: reloading allocates nothing)
or a slice of one fresh host buffer. The file is read block by block on several threads,
each ``preadv`` scattering the block's bytes into those destinations and the gaps between them
(headers, the pickle) into scratch memory, and each block is hashed from cache right after. So
every byte is copied once, from the page cache to where it stays, and checked.

When a block fails its checksum, destinations that were reused hold part of the damaged data:
the caller raises, and the objects must be loaded again from a good checkpoint.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hasten.checkpointing.storage.checksum import pieces_digest
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, FileRecord

__all__ = ["Placement", "check_blocks", "place_tensors", "read_views", "submit_blocks"]

_ALIGN = 64
_IOV_MAX = 1024  # the most buffers one preadv call takes on Linux


@dataclass
class Placement:
    """The parsed object rebuilt over its destinations, and where each file range goes."""

    result: Any
    # (file offset, destination bytes), sorted by offset and not overlapping
    pieces: list[tuple[int, memoryview]] = field(default_factory=list)


def _walk(obj: Any, like: Any, visit: Callable[[torch.Tensor, Any], None]) -> None:
    if isinstance(obj, torch.Tensor):
        visit(obj, like)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _walk(value, like.get(key) if isinstance(like, dict) else None, visit)
    elif isinstance(obj, (list, tuple)):
        same = isinstance(like, (list, tuple)) and len(like) == len(obj)
        for index, value in enumerate(obj):
            _walk(value, like[index] if same else None, visit)


def _rebuild(obj: Any, new: dict[int, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return new.get(id(obj), obj)
    if isinstance(obj, dict):
        return type(obj)((key, _rebuild(value, new)) for key, value in obj.items())
    if isinstance(obj, list):
        return [_rebuild(value, new) for value in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_rebuild(value, new) for value in obj)
    return obj


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The memory of a contiguous CPU tensor as writable bytes."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy().data


def _can_reuse(source: torch.Tensor, nbytes: int, like: Any) -> bool:
    return (
        isinstance(like, torch.Tensor)
        and like.device.type == "cpu"
        and like.layout == torch.strided
        and like.dtype == source.dtype
        and like.shape == source.shape
        and like.is_contiguous()
        and source.is_contiguous()
        and source.storage_offset() == 0
        and source.numel() * source.element_size() == nbytes
        and nbytes > 0
    )


def _over(storage: torch.UntypedStorage, tensor: torch.Tensor) -> torch.Tensor:
    rebuilt = torch.empty(0, dtype=tensor.dtype).set_(
        storage, tensor.storage_offset(), tensor.size(), tensor.stride()
    )
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(rebuilt, requires_grad=tensor.requires_grad)
    return rebuilt


def place_tensors(
    obj: Any, like: Any, file_buffer: Any, allocate: Callable[[int], Any]
) -> Placement | None:
    """Choose a destination for every tensor of ``obj`` that views ``file_buffer``.

    ``like`` is an object of the same shape (a current state dict) whose tensors are reused
    when one matches in dtype, shape and layout; the rest share one buffer from ``allocate``.
    Tensors sharing storage in the file still share it afterwards. Returns None when the file's
    tensors overlap (a malformed file), so the caller reads it the plain way instead.
    """
    base = torch.frombuffer(file_buffer, dtype=torch.uint8).data_ptr()
    end = base + len(file_buffer)
    groups: dict[tuple[int, int], list[tuple[torch.Tensor, Any]]] = {}

    def visit(tensor: torch.Tensor, match: Any) -> None:
        if tensor.device.type != "cpu" or tensor.layout != torch.strided:
            return
        storage = tensor.untyped_storage()
        if base <= storage.data_ptr() < end:
            members = groups.setdefault((storage.data_ptr(), storage.nbytes()), [])
            if all(tensor is not seen for seen, _ in members):  # a tied name: the same tensor
                members.append((tensor, match))

    _walk(obj, like, visit)
    new: dict[int, torch.Tensor] = {}
    pieces: list[tuple[int, memoryview]] = []
    fresh: list[tuple[int, int, list[torch.Tensor]]] = []
    used: set[int] = set()
    for (pointer, nbytes), members in groups.items():
        source, match = members[0]
        if len(members) == 1 and _can_reuse(source, nbytes, match) and match.data_ptr() not in used:
            used.add(match.data_ptr())
            new[id(source)] = match
            pieces.append((pointer - base, _bytes_of(match)))
        else:
            fresh.append((pointer - base, nbytes, [tensor for tensor, _ in members]))
    total = sum(-(-nbytes // _ALIGN) * _ALIGN for _, nbytes, _ in fresh)
    arena = allocate(total) if total else None
    cursor = 0
    for offset, nbytes, tensors in fresh:
        if nbytes == 0:
            for tensor in tensors:
                new[id(tensor)] = torch.empty_strided(
                    tensor.size(), tensor.stride(), dtype=tensor.dtype
                )
            continue
        view = torch.frombuffer(arena, dtype=torch.uint8, count=nbytes, offset=cursor)
        cursor += -(-nbytes // _ALIGN) * _ALIGN
        pieces.append((offset, _bytes_of(view)))
        for tensor in tensors:
            new[id(tensor)] = _over(view.untyped_storage(), tensor)
    pieces.sort(key=lambda piece: piece[0])
    for (first, data), (second, _) in zip(pieces, pieces[1:]):
        if first + data.nbytes > second:
            return None
    return Placement(_rebuild(obj, new), pieces)


def read_views(fd: int, views: list[memoryview], offset: int, path: Path) -> None:
    """Fill ``views`` in order from the file at ``offset``, however short the reads come back."""
    pending = [view for view in views if view.nbytes]
    index = 0
    while index < len(pending):
        count = os.preadv(fd, pending[index : index + _IOV_MAX], offset)
        if count == 0:
            raise CorruptCheckpointError(f"{path} shrank while it was being read.")
        offset += count
        while count:
            head = pending[index]
            if count >= head.nbytes:
                count -= head.nbytes
                index += 1
            else:
                pending[index] = head[count:]
                count = 0


def _block_views(
    pieces: list[tuple[int, memoryview]], starts: list[int], begin: int, end: int
) -> list[memoryview]:
    """The destinations of file bytes ``[begin, end)`` in order, with scratch for the gaps."""
    first = max(0, bisect.bisect_right(starts, begin) - 1)
    parts: list[tuple[int, int, memoryview | None]] = []  # (from, to, destination or gap)
    cursor = begin
    for offset, destination in pieces[first:]:
        if offset >= end:
            break
        low, high = max(offset, begin), min(offset + destination.nbytes, end)
        if high <= low:
            continue
        if low > cursor:
            parts.append((cursor, low, None))
        parts.append((low, high, destination[low - offset : high - offset]))
        cursor = high
    if cursor < end:
        parts.append((cursor, end, None))
    scratch = memoryview(bytearray(sum(high - low for low, high, part in parts if part is None)))
    views, used = [], 0
    for low, high, part in parts:
        if part is None:
            views.append(scratch[used : used + high - low])
            used += high - low
        else:
            views.append(part)
    return views


def submit_blocks(
    fd: int,
    path: Path,
    size: int,
    pieces: list[tuple[int, memoryview]],
    block_bytes: int,
    expected: FileRecord | None,
    pool: Executor | None,
) -> list[Future[bool]]:
    """Queue reading the whole file into ``pieces`` (and scratch), one block per task.

    Each task returns whether its block matches ``expected`` (True without a manifest); see
    `check_blocks`. ``fd`` must stay open until every task is done. Without a pool (or with a
    single block) the blocks are read here, one after another.
    """
    starts = [offset for offset, _ in pieces]

    def read_block(index: int) -> bool:
        begin = index * block_bytes
        views = _block_views(pieces, starts, begin, min(begin + block_bytes, size))
        read_views(fd, views, begin, path)
        return expected is None or pieces_digest(views) == expected.blocks[index]

    blocks = range(-(-size // block_bytes))
    if pool is not None and len(blocks) > 1:
        return [pool.submit(read_block, index) for index in blocks]
    done = []
    for index in blocks:
        future: Future[bool] = Future()
        future.set_result(read_block(index))
        done.append(future)
    return done


def check_blocks(path: Path, blocks: list[Future[bool]]) -> None:
    """Wait for the blocks of `submit_blocks`.

    Raises:
        CorruptCheckpointError: a block's checksum does not match (naming the file and block).
    """
    matches = [block.result() for block in blocks]
    if not all(matches):
        raise CorruptCheckpointError(
            f"{path} is corrupted: block {matches.index(False)} does not match the checksum in "
            "the manifest. Load an earlier checkpoint."
        )

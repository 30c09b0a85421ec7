"""Block checksums of checkpoint files: xxh3-64 of every 16 MiB block, checked in parallel.

A whole-file checksum can only be computed front to back on one core. Hashing fixed-size blocks
separately lets any number of threads verify (and read) a file at once, each hashing the block it
just read while it is still in cache; xxh3 runs at tens of GB/s, so verification costs little more
than the read itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

__all__ = [
    "ALGORITHM",
    "BLOCK_BYTES",
    "BlockHasher",
    "block_digest",
    "block_digests",
    "pieces_digest",
]

ALGORITHM = "xxh3_64"
# The block size new checkpoints use (read at call time, so tests can shrink it); a manifest
# records the size its files were hashed with.
BLOCK_BYTES = 16 << 20


def block_digest(data: bytes | bytearray | memoryview) -> str:
    """The hex digest of one block (or of the short last block of a file)."""
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def pieces_digest(pieces: Iterable[bytes | bytearray | memoryview]) -> str:
    """The digest of one block held in several pieces, in order (equal to `block_digest`)."""
    hasher = xxhash.xxh3_64()
    for piece in pieces:
        hasher.update(piece)
    return f"{hasher.intdigest():016x}"


def block_digests(data: bytes | bytearray | memoryview, block_bytes: int) -> list[str]:
    """The digest of every block of ``data`` held whole in memory."""
    view = memoryview(data).cast("B")
    return [block_digest(view[i : i + block_bytes]) for i in range(0, view.nbytes, block_bytes)]


class BlockHasher:
    """Digests of consecutive ``block_bytes`` blocks of a byte stream fed in pieces of any size."""

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.size = 0
        self._digests: list[str] = []
        self._current = xxhash.xxh3_64()
        self._filled = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Hash ``data`` as the next bytes of the stream."""
        view = memoryview(data).cast("B")
        self.size += view.nbytes
        while view.nbytes:
            take = min(self.block_bytes - self._filled, view.nbytes)
            if take == self.block_bytes:  # a whole block in one piece: no streaming state needed
                self._digests.append(block_digest(view[:take]))
            else:
                self._current.update(view[:take])
                self._filled += take
                if self._filled == self.block_bytes:
                    self._close_block()
            view = view[take:]

    def _close_block(self) -> None:
        self._digests.append(f"{self._current.intdigest():016x}")
        self._current = xxhash.xxh3_64()
        self._filled = 0

    def digests(self) -> list[str]:
        """Every block's digest, the short last block included (none if empty); call it last."""
        if self._filled:
            self._close_block()
        return list(self._digests)

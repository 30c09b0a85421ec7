"""Read the record files that W&B and SwanLab write offline (LevelDB log format, 7-byte header).

Each file starts with a 7-byte header (4-byte ident, 2-byte magic, 1-byte version), then 32 KiB
blocks of records: checksum (4), length (2), type (1: full, 2: first, 3: middle, 4: last).
Checksums are not verified: the tests only need the payloads back.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

__all__ = ["iter_records"]

_HEADER = 7
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def iter_records(path: Path, ident: bytes) -> Iterator[bytes]:
    """Yield every complete record payload of the log file at ``path``."""
    raw = path.read_bytes()
    assert raw[:4] == ident, f"{path} starts with {raw[:4]!r}, expected {ident!r}"
    pos = _HEADER
    pending = b""
    while pos + _HEADER <= len(raw):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _HEADER:
            pos += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", raw[pos : pos + _HEADER])
        data = raw[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            yield data
        elif kind == _FIRST:
            pending = data
        elif kind == _MIDDLE:
            pending += data
        elif kind == _LAST:
            yield pending + data
            pending = b""
        else:
            return  # zero padding at the end of the file

"""Sizes written by people: ``"10GiB"``, ``"500MB"``, ``"8Gb"`` -> a number of bytes.

Shared by device-map planning (max_memory) and checkpoint sharding (max_shard_size).
"""

from __future__ import annotations

__all__ = ["convert_bytes", "convert_file_size_to_int"]

_UNITS = (
    ("GIB", 2**30, False),
    ("MIB", 2**20, False),
    ("KIB", 2**10, False),
    ("GB", 10**9, True),
    ("MB", 10**6, True),
    ("KB", 10**3, True),
)


def convert_file_size_to_int(size: int | str) -> int:
    """Turn a size such as ``"5GB"``, ``"10GiB"`` or ``"500MB"`` into a number of bytes.

    A lower-case ``b`` (``"8Gb"``) means bits, as in Accelerate. Integers pass through.

    Raises:
        ValueError: if the size is negative or not a number followed by a known unit.
    """
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise TypeError(f"size must be an int or a string like '10GiB', got {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"size must be >= 0 bytes, got {size!r}")
        return size
    text = size.strip()
    upper = text.upper()
    for unit, factor, bits_allowed in _UNITS:
        if upper.endswith(unit):
            try:
                value = int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
            if value < 0:
                break
            return value // 8 if bits_allowed and text.endswith("b") else value
    if text.isdigit():
        return int(text)
    raise ValueError(
        f"size {size!r} is not in a valid format: use an integer number of bytes or a number "
        "with a unit among GiB, MiB, KiB, GB, MB, KB (for example '10GiB' or '500MB')."
    )


def convert_bytes(size: float) -> str:
    """Format a byte count in the largest binary unit below 1024 of it: ``convert_bytes(1536)`` -> ``"1.5 KB"``.

    Units step by 1024 (bytes, KB, MB, GB, TB, then PB), values are rounded to 2 decimals, as
    Accelerate prints them in `hasten estimate-memory` and logs.
    """
    value = size
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if value < 1024.0:
            return f"{round(value, 2)} {unit}"
        value /= 1024.0
    return f"{round(value, 2)} PB"

"""The one safetensors codec: dtype codes, header parsing, zero-copy decoding, streamed encoding.

The format is an 8-byte little-endian header length, a JSON header (``{name: {dtype, shape,
data_offsets}}`` plus optional ``__metadata__``), then the raw little-endian tensor bytes.
Checkpoints (``checkpointing/tensors.py``: verified buffers, tied-weight aliases) and disk
offload / checkpoint loading (``big_modeling``: memory-mapped files) both read and write through
here, so a dtype or a layout rule is handled in exactly one place. The ``safetensors`` library
is not needed.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
import torch

__all__ = [
    "DTYPE_CODES",
    "SAFETENSORS_DTYPES",
    "decode_safetensors",
    "encode_safetensors",
    "parse_header",
    "read_safetensors_header",
    "read_safetensors_tensor",
]

#: safetensors dtype code -> torch dtype.
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
#: torch dtype -> safetensors dtype code (dtypes missing here are not encodable).
DTYPE_CODES: dict[torch.dtype, str] = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}


def _dtype(code: str, name: str) -> torch.dtype:
    dtype = SAFETENSORS_DTYPES.get(code)
    if dtype is None:
        raise ValueError(
            f"tensor {name!r} has unsupported safetensors dtype {code!r}; supported: "
            f"{sorted(SAFETENSORS_DTYPES)}"
        )
    return dtype


def parse_header(prefix: bytes, read: Any, where: str, size: int | None) -> tuple[int, Any]:
    """``(data start, header incl. __metadata__)`` from the first 8 bytes and a reader of more.

    ``read(n)`` returns the next ``n`` bytes after the length; ``size`` (when known) bounds it.

    Raises:
        ValueError: shorter than the 8-byte length, a length out of range, or a corrupt header.
    """
    if len(prefix) < 8:
        raise ValueError(f"{where} is not a safetensors file (shorter than its 8-byte header size)")
    length = int.from_bytes(prefix[:8], "little")
    if length <= 0 or (size is not None and 8 + length > size):
        raise ValueError(
            f"{where} is not a safetensors file: header length {length} is out of range"
        )
    try:
        header = json.loads(read(length))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{where} has a corrupt safetensors header: {err}") from err
    if not isinstance(header, dict):
        raise ValueError(f"{where} has a corrupt safetensors header: not a JSON object")
    return 8 + length, header


@lru_cache(maxsize=64)
def _file_header(path: str, mtime: float) -> tuple[int, dict[str, Any]]:
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        start, header = parse_header(handle.read(8), handle.read, repr(path), size)
    header.pop("__metadata__", None)
    return start, header


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[int, dict[str, Any]]:
    """Return ``(data start offset, {name: {dtype, shape, data_offsets}})`` of a safetensors file.

    Cached per path and modification time (files are read tensor by tensor).

    Raises:
        ValueError: the file is not a safetensors file (the message says what is off).
    """
    text = os.fspath(path)
    return _file_header(text, os.path.getmtime(text))


def read_safetensors_tensor(path: str | os.PathLike[str], name: str) -> torch.Tensor:
    """Map tensor ``name`` of a safetensors file (copy-on-write, read lazily when used)."""
    text = os.fspath(path)
    start, header = read_safetensors_header(text)
    info = header[name]
    dtype = _dtype(info["dtype"], name)
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if end == begin:
        return torch.empty(shape, dtype=dtype)
    array = np.memmap(text, dtype=np.uint8, mode="c", offset=start + begin, shape=(end - begin,))
    return torch.from_numpy(array).view(dtype).reshape(shape)


def decode_safetensors(
    buffer: bytearray | mmap.mmap,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Zero-copy tensors over a safetensors file held in ``buffer``, and its ``__metadata__``.

    Raises:
        ValueError: the buffer is not a valid safetensors file (the message says what is off).
    """
    base, header = parse_header(
        bytes(buffer[:8]), lambda n: bytes(buffer[8 : 8 + n]), "buffer", len(buffer)
    )
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        dtype = _dtype(info["dtype"], name)
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if end == begin:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(
            buffer, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=base + begin
        )
        tensors[name] = flat.view(shape)
    return tensors, metadata


def encode_safetensors(
    handle: Any, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> None:
    """Stream contiguous CPU ``tensors`` (no shared storage) to ``handle`` as safetensors.

    No copy of the whole file is built: the header goes out, then each tensor's memory as it is.

    Raises:
        ValueError: a tensor's dtype has no safetensors code (see `DTYPE_CODES`).
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, tensor in tensors.items():
        code = DTYPE_CODES.get(tensor.dtype)
        if code is None:
            raise ValueError(
                f"tensor {name!r} has dtype {tensor.dtype}, which has no safetensors code here; "
                f"supported: {sorted(str(d) for d in DTYPE_CODES)}"
            )
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": code,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as the spec asks
    handle.write(len(encoded).to_bytes(8, "little") + encoded)
    for tensor in tensors.values():
        if tensor.numel():
            handle.write(tensor.view(-1).view(torch.uint8).numpy().data)

"""The one safetensors codec: files the library reads, the library's files read, bad input named."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hasten.core.safetensors_format import (
    DTYPE_CODES,
    SAFETENSORS_DTYPES,
    decode_safetensors,
    encode_safetensors,
    read_safetensors_header,
    read_safetensors_tensor,
)


def _every_dtype() -> dict[str, torch.Tensor]:
    return {
        code: torch.arange(6, dtype=torch.float32).reshape(2, 3).to(dtype)
        for code, dtype in SAFETENSORS_DTYPES.items()
    }


def test_encoded_files_load_with_the_library_and_decode_in_place(tmp_path: Path) -> None:
    tensors = {**_every_dtype(), "empty": torch.empty(0, 2)}
    out = io.BytesIO()
    encode_safetensors(out, tensors, {"format": "pt", "note": "x"})
    (tmp_path / "m.safetensors").write_bytes(out.getvalue())
    library = load_file(str(tmp_path / "m.safetensors"))
    decoded, metadata = decode_safetensors(bytearray(out.getvalue()))
    assert metadata == {"format": "pt", "note": "x"}
    for name, tensor in tensors.items():
        assert library[name].dtype == decoded[name].dtype == tensor.dtype, name
        assert torch.equal(library[name], tensor) and torch.equal(decoded[name], tensor), name


def test_library_files_are_read_by_header_and_memory_map(tmp_path: Path) -> None:
    path = tmp_path / "lib.safetensors"
    tensors = _every_dtype()
    save_file(tensors, str(path))
    start, header = read_safetensors_header(path)
    assert start > 8 and set(header) == set(tensors)
    assert {info["dtype"] for info in header.values()} == set(SAFETENSORS_DTYPES)
    for name, tensor in tensors.items():
        assert torch.equal(read_safetensors_tensor(path, name), tensor), name
    assert set(DTYPE_CODES.values()) == set(SAFETENSORS_DTYPES)


def test_bad_files_and_dtypes_say_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(ValueError, match="corrupt safetensors header"):
        read_safetensors_header(tmp_path / "bad.safetensors")
    (tmp_path / "short.safetensors").write_bytes(b"\x01")
    with pytest.raises(ValueError, match="not a safetensors file .shorter than its 8-byte"):
        read_safetensors_header(tmp_path / "short.safetensors")
    with pytest.raises(ValueError, match="header length .* is out of range"):
        decode_safetensors(bytearray(b"\xff" * 16))
    header = b'{"t":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}'
    data = bytearray(len(header).to_bytes(8, "little") + header + b"\x00")
    with pytest.raises(ValueError, match=r"unsupported safetensors dtype 'Q9'; supported: \["):
        decode_safetensors(data)
    with pytest.raises(ValueError, match="complex64, which has no safetensors code"):
        encode_safetensors(io.BytesIO(), {"z": torch.zeros(2, dtype=torch.complex64)}, {})

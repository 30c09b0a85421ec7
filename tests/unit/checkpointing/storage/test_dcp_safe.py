"""Reading DCP checkpoints runs no code from them: a crafted index or bytes entry is refused."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.checkpointing.storage.io import UnsafeCheckpointError


class Payload:
    """Unpickling this runs a shell command that leaves ``marker`` behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _dcp_save(state: dict[str, Any], folder: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=folder, no_dist=True)


def _state() -> dict[str, Any]:
    return {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "lr": 0.5}


def _craft_index(folder: Path, marker: Path) -> None:
    """Put ``Payload`` into the saved ``.metadata`` (as a field DCP keeps: the save id)."""
    index = folder / ".metadata"
    metadata = pickle.loads(index.read_bytes())  # noqa: S301 - our own fresh save
    metadata.storage_meta.save_id = Payload(marker)
    index.write_bytes(pickle.dumps(metadata))


def test_index_classes_of_a_real_save_are_allowed(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.dcp_safe import load_metadata

    _dcp_save(_state(), tmp_path)  # a plain save's index also holds its pathlib checkpoint_id
    metadata = load_metadata((tmp_path / ".metadata").read_bytes(), tmp_path)
    assert metadata.state_dict_metadata["model.w"].size == torch.Size([2, 3])
    assert metadata.state_dict_metadata["model.w"].properties.dtype is torch.float32


def test_a_crafted_index_is_refused_without_running_it(tmp_path: Path) -> None:
    from hasten.checkpointing.dcp_folders import load_sharded_state
    from hasten.checkpointing.merge import load_merged_state_dict

    folder, marker = tmp_path / "ckpt", tmp_path / "ran"
    _dcp_save(_state(), folder)
    _craft_index(folder, marker)
    calls = [
        lambda: load_merged_state_dict(folder),  # hasten merge-weights
        lambda: load_sharded_state({"model": {"w": torch.zeros(2, 3)}}, folder),
    ]
    for call in calls:
        with pytest.raises(UnsafeCheckpointError) as caught:
            call()
        message = str(caught.value)
        assert "posix.system" in message and "does not unpickle" in message
        assert "torch.distributed.checkpoint.load" in message  # how to proceed if trusted
    assert not marker.exists()


def test_the_parted_reader_refuses_a_crafted_part_index(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.dcp_storage import PartedReader

    marker = tmp_path / "ran"
    _dcp_save(_state(), tmp_path / "pytorch_model_fsdp_0")
    _craft_index(tmp_path / "pytorch_model_fsdp_0", marker)
    with pytest.raises(UnsafeCheckpointError, match=r"posix\.system"):
        PartedReader(tmp_path, ["pytorch_model_fsdp_0"], None)
    assert not marker.exists()


def test_an_index_that_is_not_dcp_metadata_is_refused(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.dcp_safe import load_metadata

    with pytest.raises(UnsafeCheckpointError, match="holds a dict, not a DCP index"):
        load_metadata(pickle.dumps({"a": 1}), tmp_path)
    with pytest.raises(UnsafeCheckpointError, match="its DCP index cannot be read"):
        load_metadata(b"not a pickle", tmp_path)


def test_a_crafted_bytes_entry_is_refused_without_running_it(tmp_path: Path) -> None:
    from hasten.checkpointing.dcp_folders import load_sharded_state

    marker = tmp_path / "ran"
    _dcp_save({**_state(), "lr": Payload(marker)}, tmp_path / "ckpt")
    template = {"model": {"w": torch.zeros(2, 3)}, "lr": 0.0}
    with pytest.raises(UnsafeCheckpointError, match=r"entry 'lr'.*could run code"):
        load_sharded_state(template, tmp_path / "ckpt")
    assert not marker.exists()
    # the same checkpoint with plain data loads, bytes entries included
    _dcp_save(_state(), tmp_path / "plain")
    loaded = load_sharded_state(template, tmp_path / "plain")
    assert loaded["lr"] == 0.5 and torch.equal(loaded["model"]["w"], _state()["model"]["w"])


def _archive(value: Any) -> tuple[memoryview, torch.UntypedStorage]:
    """``torch.save`` bytes of ``value`` as DCP stores a tensor entry, and a storage over them."""
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    data = bytearray(buffer.getvalue())
    return memoryview(data), torch.frombuffer(data, dtype=torch.uint8).untyped_storage()


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12.0).reshape(3, 4),
        torch.arange(2 << 18, dtype=torch.int64),  # over the small-archive size: read in place
        torch.tensor(7.0, dtype=torch.bfloat16),
        torch.ones(0, 5),
    ],
    ids=["matrix", "large", "bf16-scalar", "empty"],
)
def test_a_tensor_entry_decodes_as_a_view_of_its_bytes(tensor: torch.Tensor) -> None:
    from hasten.checkpointing.storage.dcp_safe import load_tensor_item

    view, storage = _archive(tensor)
    loaded = load_tensor_item(view, storage)
    assert torch.equal(loaded, tensor) and loaded.dtype == tensor.dtype
    if tensor.numel():  # its data lies in the archive's bytes: not copied out
        start = storage.data_ptr()
        assert start <= loaded.data_ptr() < start + storage.nbytes()


def test_a_tensor_entry_in_another_byte_order_is_copied_not_swapped_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hasten.checkpointing.storage.io as checkpoint_io
    from hasten.checkpointing.storage.dcp_safe import load_tensor_item

    view, storage = _archive(torch.arange(4.0))
    before = bytes(view)
    monkeypatch.setattr(checkpoint_io, "_NATIVE_ORDER", b"big")  # the archive's mark no longer
    loaded = load_tensor_item(view, storage)  # matches
    assert torch.equal(loaded, torch.arange(4.0))
    assert bytes(view) == before  # the (in use: read-only mapped) bytes were left alone
    assert not storage.data_ptr() <= loaded.data_ptr() < storage.data_ptr() + storage.nbytes()


def test_a_tensor_entry_decodes_without_torchs_private_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hasten.checkpointing.storage.dcp_safe as dcp_safe
    import hasten.checkpointing.storage.io as checkpoint_io

    def old_load(zip_file: Any, map_location: Any, pickle_module: Any) -> None: ...

    with monkeypatch.context() as patched:  # a torch whose _load takes no storage: not used
        patched.setattr(torch.serialization, "_load", old_load)
        checkpoint_io.in_place_loader.cache_clear()
        assert checkpoint_io.in_place_loader() is None
    checkpoint_io.in_place_loader.cache_clear()
    assert checkpoint_io.in_place_loader() is not None
    monkeypatch.setattr(dcp_safe, "in_place_loader", lambda: None)
    view, storage = _archive(torch.arange(5.0))
    loaded = dcp_safe.load_tensor_item(view, storage)
    assert torch.equal(loaded, torch.arange(5.0))
    assert not storage.data_ptr() <= loaded.data_ptr() < storage.data_ptr() + storage.nbytes()


def test_a_crafted_tensor_entry_is_refused_without_running_it(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.dcp_safe import load_tensor_item

    marker = tmp_path / "ran"
    view, storage = _archive({"w": torch.ones(2), "x": Payload(marker)})
    with pytest.raises(pickle.UnpicklingError):
        load_tensor_item(view, storage)
    assert not marker.exists()

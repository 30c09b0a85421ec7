"""Unit tests for hasten.ops.comm: LocalComm, TorchComm over a 1-process gloo group, selection."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from _support.distributed import free_port
from hasten.ops.comm import LocalComm, TorchComm, current_comm, reset_comm, set_comm
from hasten.state import recorder


def test_local_comm_is_identity() -> None:
    comm = LocalComm()
    flat = torch.arange(3.0)
    assert comm.all_gather(flat, "gather") is flat
    comm.all_reduce(flat, "sum", "reduce")
    comm.broadcast(flat, 0, "broadcast")
    assert flat.tolist() == [0.0, 1.0, 2.0]
    assert comm.all_gather_object("x", "gather_object") == ["x"]
    objs = [1]
    comm.broadcast_object_list(objs, 0, "broadcast_object_list")
    assert objs == [1]
    assert comm.device == torch.device("cpu")
    assert repr(comm) == "LocalComm()"


def test_set_and_reset_comm() -> None:
    comm = LocalComm()
    assert set_comm(comm) is comm
    assert current_comm() is comm
    reset_comm()
    other = LocalComm()
    set_comm(other)
    assert current_comm() is other


@pytest.fixture
def gloo_group() -> Iterator[None]:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=10),
    )
    yield
    dist.destroy_process_group()
    reset_comm()


def test_torch_comm_over_one_process(gloo_group: None) -> None:
    recorder.reset()
    comm = TorchComm(1, 0, "gloo", torch.device("cpu"))
    flat = torch.arange(3.0)
    assert torch.equal(comm.all_gather(flat, "gather"), flat)
    comm.all_reduce(flat, "max", "reduce")
    comm.broadcast(flat, 0, "broadcast")
    assert flat.tolist() == [0.0, 1.0, 2.0]
    assert comm.all_gather_object({"a": 1}, "gather_object") == [{"a": 1}]
    objs = ["x"]
    comm.broadcast_object_list(objs, 0, "broadcast_object_list")
    assert objs == ["x"]
    assert recorder.sequence_number() == 5  # every call went through the recorder
    assert "backend='gloo'" in repr(comm)


def test_torch_comm_falls_back_to_list_gather(
    gloo_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.ops import comm as comm_module

    def unsupported(out: torch.Tensor, flat: torch.Tensor) -> None:
        raise RuntimeError("no support for _allgather_base in Gloo process group")

    monkeypatch.setattr(comm_module, "_gather_into_tensor", unsupported)
    comm = TorchComm(1, 0, "gloo", torch.device("cpu"))
    assert comm.all_gather(torch.arange(2.0), "gather").tolist() == [0.0, 1.0]
    assert comm._gather_into is False  # decided once
    assert comm.all_gather(torch.arange(2.0), "gather").tolist() == [0.0, 1.0]


def test_torch_comm_other_gather_errors_propagate(
    gloo_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.ops import comm as comm_module

    def broken(out: torch.Tensor, flat: torch.Tensor) -> None:
        raise RuntimeError("size mismatch")

    monkeypatch.setattr(comm_module, "_gather_into_tensor", broken)
    with pytest.raises(RuntimeError, match="size mismatch"):
        TorchComm(1, 0, "gloo", torch.device("cpu")).all_gather(torch.ones(1), "gather")


def test_comm_is_rechosen_when_the_group_changes(gloo_group: None) -> None:
    stale = LocalComm()
    set_comm(stale)
    assert current_comm() is stale  # chosen for this group, reused


def test_current_comm_is_local_without_a_process_group() -> None:
    reset_comm()
    comm = current_comm()
    assert isinstance(comm, LocalComm)
    assert comm.num_processes == 1
    assert current_comm() is comm  # chosen once, then reused

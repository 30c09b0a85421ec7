"""Unit tests for hasten.ops.debug: signatures and the cross-process agreement check."""

from __future__ import annotations

import pytest
import torch

from hasten.ops.debug import DistributedOperationException, check_operation, signature
from unit.ops.mirror_comm import MirrorComm


def test_signature_describes_shapes_dtypes_and_masks() -> None:
    data = {"x": torch.ones(4, 3), "y": [torch.ones(2, dtype=torch.long)], "n": 3}
    assert signature(data) == "{x: tensor[4, 3], y: [tensor[2] int64], n: int}"
    assert signature((torch.ones(4, 3),), masked_dim=0) == "(tensor[*, 3])"
    assert signature(torch.ones(4, 3), masked_dim=-1) == "tensor[4, *]"


def test_check_operation_passes_when_all_agree() -> None:
    comm = MirrorComm()
    check_operation(comm, "reduce", torch.ones(2))
    assert comm.calls == [("all_gather_object", "reduce (debug shape check)")]


def test_check_operation_names_each_rank_on_any_rank() -> None:
    comm = MirrorComm(process_index=1, peer=("gather", "tensor[4, 3]", ""))
    with pytest.raises(
        DistributedOperationException,
        match=r"Cannot run `gather`.*rank 0: gather of tensor\[4, 3\]; rank 1: gather of tensor\[5, 3\]",
    ):
        check_operation(comm, "gather", torch.ones(5, 3))


def test_check_operation_reports_different_operations() -> None:
    comm = MirrorComm(peer=("reduce", "tensor[2]", ""))
    with pytest.raises(
        ValueError, match=r"rank 0: broadcast of tensor\[2\]; rank 1: reduce of tensor\[2\]"
    ):
        check_operation(comm, "broadcast", torch.ones(2))


def test_check_operation_reports_tensors_on_the_wrong_device() -> None:
    comm = MirrorComm()
    comm.device = torch.device("meta")  # pretend the backend works on another device
    with pytest.raises(
        DistributedOperationException, match=r"rank 0 passed tensors on cpu \(expected meta\)"
    ):
        check_operation(comm, "gather", torch.ones(2))

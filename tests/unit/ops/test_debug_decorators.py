"""ops.debug decorators (Accelerate's verify_operation/chained_operation) and ops.shapes."""

from __future__ import annotations

import pytest
import torch

from hasten.ops.comm import reset_comm, set_comm
from hasten.ops.debug import DistributedOperationException, chained_operation, verify_operation
from hasten.ops.shapes import TENSOR_INT_TO_DTYPE, TENSOR_TYPE_TO_INT, gather_tensor_shape
from unit.ops.mirror_comm import MirrorComm


@verify_operation
def _collective(tensor: torch.Tensor) -> str:
    return "ran"


@chained_operation
def _outer(tensor: torch.Tensor) -> str:
    return _collective(tensor)


def test_verify_operation_passes_through_without_debug_mode(mirror: MirrorComm) -> None:
    assert _collective(torch.ones(2)) == "ran"
    assert mirror.calls == []


def test_verify_operation_checks_shapes_in_debug_mode() -> None:
    comm = MirrorComm(debug=True, peer=("x", "tensor[3]", ""))
    set_comm(comm)
    try:
        with pytest.raises(DistributedOperationException, match="calling `.*_outer`") as info:
            _outer(tensor=torch.ones(2))
        cause = str(info.value.__cause__)
        assert "rank 1: x of tensor[3]" in cause and "_collective of tensor[2]" in cause
        set_comm(MirrorComm(debug=True))
        assert _outer(torch.ones(2)) == "ran"
    finally:
        reset_comm()


def test_dtype_codes_round_trip() -> None:
    assert TENSOR_TYPE_TO_INT[torch.float32] == 1 and TENSOR_TYPE_TO_INT[torch.bool] == 10
    assert all(TENSOR_INT_TO_DTYPE[code] is dtype for dtype, code in TENSOR_TYPE_TO_INT.items())


def test_gather_tensor_shape_on_one_process() -> None:
    shape, code = gather_tensor_shape(torch.zeros(3, 0, 5, dtype=torch.int16))
    assert shape.tolist() == [3, 0, 5] and TENSOR_INT_TO_DTYPE[code] is torch.int16


def test_gather_tensor_shape_bad_input() -> None:
    with pytest.raises(ValueError, match="no process passed a tensor"):
        gather_tensor_shape(None)
    with pytest.raises(ValueError, match="cannot describe dtype torch.complex64"):
        gather_tensor_shape(torch.zeros(2, dtype=torch.complex64))

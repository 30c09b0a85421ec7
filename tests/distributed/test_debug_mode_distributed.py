"""ACCELERATE_DEBUG_MODE on 2 gloo processes: a shape mismatch raises on every rank, no hang."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed]


def _mismatched_gather() -> dict[str, Any]:
    from hasten.ops.collectives import gather, reduce
    from hasten.ops.debug import DistributedOperationException
    from hasten.state import PartialState

    state = PartialState()
    rank = state.process_index
    same = reduce(torch.ones(3), reduction="sum").tolist()  # matching shapes still work
    try:
        gather(torch.ones(4 + rank, 3))
    except DistributedOperationException as err:
        message = str(err)
    else:
        message = "no error"
    try:
        if rank == 0:
            reduce({"a": torch.ones(2)})
        else:
            gather({"a": torch.ones(2)})
    except ValueError as err:
        other = str(err)
    else:
        other = "no error"
    return {"debug": state.debug, "same": same, "message": message, "other": other}


@pytest.mark.timeout(60)
def test_debug_mode_shape_mismatch_raises_on_every_rank() -> None:
    results = run_distributed(_mismatched_gather, timeout=45, env={"ACCELERATE_DEBUG_MODE": "1"})
    for out in results:
        assert out["debug"] is True
        assert out["same"] == [2.0, 2.0, 2.0]
        assert "rank 0: gather of tensor[4, 3]; rank 1: gather of tensor[5, 3]" in out["message"]
        assert "rank 0: reduce of {a: tensor[2]}; rank 1: gather of {a: tensor[2]}" in out["other"]

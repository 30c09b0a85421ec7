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


def _toggled_at_run_time() -> dict[str, Any]:
    from hasten.ops.collectives import pad_across_processes, reduce
    from hasten.ops.debug import DistributedOperationException
    from hasten.state import PartialState

    state = PartialState()
    rank = state.process_index
    reduce(torch.ones(2))  # the communicator is chosen (and cached) with debug mode off
    state.debug = True  # Accelerate's test_ops switches it on like this
    data = torch.ones(1, 5) if rank == 0 else torch.ones(1, 1, 6)
    try:
        pad_across_processes(data, dim=0)
    except DistributedOperationException as err:
        raised = str(err)
    else:
        raised = "no error"
    state.debug = False
    return {"raised": raised, "after": reduce(torch.ones(2), reduction="sum").tolist()}


@pytest.mark.timeout(60)
def test_debug_mode_switched_on_through_the_state_applies_to_the_next_collective() -> None:
    for out in run_distributed(_toggled_at_run_time, timeout=45):
        assert "rank 0: pad_across_processes" in out["raised"], out["raised"]
        assert out["after"] == [2.0, 2.0]

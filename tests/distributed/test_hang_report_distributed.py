"""No silent hangs: a collective timeout on 2 gloo processes names what every rank was doing."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
import torch

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed]

SOURCE = Path(__file__).read_text(encoding="utf-8").splitlines()


def _line_of(marker: str) -> int:
    return next(i for i, line in enumerate(SOURCE, start=1) if line.rstrip().endswith(marker))


def _diverge() -> str:
    from hasten.ops.collectives import gather
    from hasten.state import PartialState
    from hasten.state.recorder import CollectiveTimeoutError

    state = PartialState(timeout=datetime.timedelta(seconds=2))
    try:
        if state.process_index == 0:
            gather(torch.ones(4, 3))  # site: gather
        else:
            state.wait_for_everyone()  # site: wait
    except CollectiveTimeoutError as err:
        return str(err)
    return "no error"


@pytest.mark.timeout(60)
def test_timeout_reports_every_rank_operation_and_call_site() -> None:
    gather_site = f"test_hang_report_distributed.py:{_line_of('# site: gather')}"
    wait_site = f"test_hang_report_distributed.py:{_line_of('# site: wait')}"
    for rank, message in enumerate(run_distributed(_diverge, timeout=45)):
        # the first rank to time out closes its connections; the other may see that first
        assert f"on rank {rank}. What each rank was doing" in message
        assert "timed out after 2s" in message or "a peer closed its connection" in message
        lines = message.splitlines()
        row0 = next(line for line in lines if line.startswith("0 "))
        row1 = next(line for line in lines if line.startswith("1 "))
        assert "gather" in row0
        assert "tensor[4, 3]" in row0
        assert gather_site in row0
        assert "wait_for_everyone" in row1
        assert wait_site in row1


def _one_rank_elsewhere() -> str:
    from hasten.ops.collectives import reduce
    from hasten.state import PartialState, recorder
    from hasten.state.recorder import CollectiveTimeoutError

    recorder.REPORT_WAIT_S = (1.0, 1.0)  # this worker only: give up on silent ranks quickly
    state = PartialState(timeout=datetime.timedelta(seconds=2))
    if state.process_index == 1:
        # busy outside any collective: wait until rank 0 has timed out and published its
        # record, then stay away longer than its 1 s reporting window
        store = torch.distributed.distributed_c10d._get_default_store()
        store.wait(["hasten/flight/0"], datetime.timedelta(seconds=30))
        time.sleep(1.5)
        return "slept"
    try:
        reduce(torch.ones(2))
    except CollectiveTimeoutError as err:
        return str(err)
    return "no error"


@pytest.mark.timeout(60)
def test_rank_outside_collectives_is_reported_as_no_report() -> None:
    message, slept = run_distributed(_one_rank_elsewhere, timeout=45)
    assert slept == "slept"
    row1 = next(line for line in message.splitlines() if line.startswith("1 "))
    assert "no report" in row1
    assert "reduce" in next(line for line in message.splitlines() if line.startswith("0 "))

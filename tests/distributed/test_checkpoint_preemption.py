"""Preemption agreement on 2 processes: a signal to one rank stops both at the same boundary."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed


def _signal_rank_one_at_boundary(signalled_at: int) -> dict[str, Any]:
    from hasten.checkpointing.preemption import PreemptionWatcher
    from hasten.data_loader.base import ResumableDataLoader
    from hasten.state import PartialState

    state = PartialState()
    saves: list[int] = []
    boundary = 0
    watcher = PreemptionWatcher(lambda: str(saves.append(boundary) or "folder"))
    assert watcher.install()
    hook = ResumableDataLoader.batch_boundary_hook
    assert hook is not None
    try:
        for boundary in range(1, 20):
            if state.process_index == 1 and boundary == signalled_at:
                os.kill(os.getpid(), signal.SIGUSR1)
            hook()
    except SystemExit as exc:
        return {"code": exc.code, "boundary": boundary, "saves": saves}
    return {"code": None, "boundary": boundary, "saves": saves}


@pytest.mark.timeout(90)
def test_both_processes_checkpoint_at_the_same_boundary() -> None:
    results = run_distributed(_signal_rank_one_at_boundary, 5, world_size=2, timeout=60)
    # The flag raised before boundary 5 travels with the all-reduce issued there and is read
    # at boundary 6, on both processes.
    assert results[0] == results[1] == {"code": 75, "boundary": 6, "saves": [6]}

"""Run several user scripts one after another in this process, as ``python script.py ARGS`` would.

Usage: ``python run_scripts.py JOBS.json`` or ``hasten launch ... run_scripts.py JOBS.json``.
JOBS.json is a list of ``{"name", "script", "args", "cwd"}``. Each script runs as ``__main__``
(``runpy``) with its own ``sys.argv``, in its own working folder, with this process's standard
output written to ``<cwd>/stdout.<rank>.txt``; hasten's shared state is reset between scripts.
Under a launch the scripts share one process group: `end_training()` leaves it up, and it is
destroyed after the last script.
Launching once for a batch of examples spares a torch import and a rendezvous per script
(~5 s each on 2 cores). The first failure stops every process (exit 1, traceback on stderr).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["main", "run_job"]


def run_job(job: dict[str, object], rank: str) -> float:
    """Run one script as ``__main__`` in its folder; return its wall time in seconds."""
    cwd = Path(str(job["cwd"]))
    cwd.mkdir(parents=True, exist_ok=True)
    script = str(job["script"])
    argv = [script, *(str(a) for a in list(job.get("args") or []))]
    start = time.perf_counter()
    before = os.getcwd()
    os.chdir(cwd)
    sys.argv = argv
    try:
        with (cwd / f"stdout.{rank}.txt").open("w") as out, contextlib.redirect_stdout(out):
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    raise
    finally:
        os.chdir(before)
        _reset_hasten_state()
    return time.perf_counter() - start


def _reset_hasten_state() -> None:
    """Forget the script's Accelerator, as a new process would; keep a launch's process group.

    Under a launch the group outlives each script (see `_keep_process_group`), so the process
    state that holds it is kept too.
    """
    from hasten.state import PartialState
    from hasten.state._shared import reset_state

    kept = dict(PartialState._shared_state) if _world_size() > 1 else {}
    reset_state()
    PartialState._shared_state.update(kept)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _keep_process_group() -> Callable[[], None]:
    """Make the scripts' `end_training()` leave the launch's process group up; return the undo.

    Each script ends with `end_training()`, which destroys the default group. One rendezvous per
    script after that would race on a loaded machine; the batch keeps one group for all scripts
    and destroys it once at the end.
    """
    from hasten.state.partial import PartialState

    original = PartialState.destroy_process_group

    def destroy_other_groups(self: PartialState, group: Any = None) -> None:
        if group is not None:
            original(self, group)

    PartialState.destroy_process_group = destroy_other_groups  # type: ignore[method-assign]

    def undo() -> None:
        PartialState.destroy_process_group = original  # type: ignore[method-assign]
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    return undo


def main() -> int:
    """Run every job of the file named on the command line; stop at the first failure."""
    jobs = json.loads(Path(sys.argv[1]).read_text())
    rank = os.environ.get("RANK", "0")
    undo = _keep_process_group() if _world_size() > 1 else (lambda: None)
    for job in jobs:
        try:
            seconds = run_job(job, rank)
        except BaseException:
            print(f"[rank {rank}] example {job['name']} failed:", file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
            return 1
        print(f"[rank {rank}] example {job['name']} ok in {seconds:.1f} s", flush=True)
    undo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

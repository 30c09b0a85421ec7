"""Shared timing for the 2-process benchmarks (bench_fsdp, bench_tp, bench_deepspeed).

A benchmark script calls `relaunch_under_torchrun(__file__)` first: started plainly, it reruns
itself under ``torchrun --nproc_per_node 2 --standalone`` with the same arguments and exits with
that job's code; under torchrun it returns. `timed` runs named loops for a number of rounds,
rotating their order every round (so no loop always runs first), each one between two barriers;
`report` prints, on rank 0, every loop's median and best time and its ratio to a base loop.
Import it as ``from _harness import ...``: Python puts the script's folder on ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

__all__ = ["record_snapshot_holds", "relaunch_under_torchrun", "report", "timed"]


def relaunch_under_torchrun(script: str, nproc: int = 2, timeout: float = 900) -> None:
    """Rerun ``script`` under torchrun with this command line's arguments, unless already there."""
    if "LOCAL_RANK" in os.environ:
        return
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc_per_node", str(nproc), "--standalone", script, *sys.argv[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    raise SystemExit(subprocess.run(cmd, env=env, timeout=timeout, check=False).returncode)


def timed(rounds: int, loops: dict[str, Callable[[], None]]) -> dict[str, list[float]]:
    """Seconds of each call of each loop, ``rounds`` calls each, the order rotated every round."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            dist.barrier()
            start = time.perf_counter()
            loops[name]()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
    return times


def report(
    title: str,
    times: dict[str, list[float]],
    base: str,
    unit: float = 1e3,
    label: str = "ms",
) -> None:
    """Print (rank 0) each loop's median and best, times ``unit`` in ``label``, and ratio to ``base``."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    width = max(len(name) for name in times) + 2
    print(title)
    for name in times:
        print(
            f"  {name:<{width}} median {med[name] * unit:9.1f} {label} "
            f"(ratio {med[name] / med[base]:.3f})"
            f"   best {best[name] * unit:9.1f} {label} (ratio {best[name] / best[base]:.3f})"
        )


def record_snapshot_holds() -> tuple[list[float], Callable[[], None]]:
    """Time every wait of a step for an async save's state copy (hasten's ``Snapshot._hold``).

    Returns:
        The list each wait's seconds are appended to, and a function that undoes the patch.
    """
    from hasten.checkpointing.storage import writer

    held: list[float] = []
    hold = writer.Snapshot._hold

    def timed_hold(self: Any, *args: Any) -> None:
        start = time.perf_counter()
        hold(self, *args)
        held.append(time.perf_counter() - start)

    def restore() -> None:
        writer.Snapshot._hold = hold  # type: ignore[method-assign]

    writer.Snapshot._hold = timed_hold  # type: ignore[method-assign]
    return held, restore

"""The ``hasten test`` self-check: run under ``hasten launch``, every process checks itself.

Each check runs on its own, so one failure does not hide the others; the main process prints
one PASS/FAIL line per check and the script exits 1 if any failed on any process. A missing
hasten module fails its checks with the import error instead of crashing the run.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = [
    "CHECKS",
    "check_broadcast",
    "check_gather",
    "check_reduce",
    "check_split_between_processes",
    "check_state",
    "check_wait_for_everyone",
    "main",
]


def _state() -> Any:
    from hasten.state import PartialState

    return PartialState()


def check_state() -> None:
    """PartialState agrees with the launcher on the world size and this process's index."""
    from hasten.config import envvars

    state = _state()
    expected = envvars.read_int("WORLD_SIZE", 1)
    if state.num_processes != expected:
        raise AssertionError(f"num_processes={state.num_processes}, launcher said {expected}")
    rank = envvars.read_int("RANK", 0)
    if state.process_index != rank:
        raise AssertionError(f"process_index={state.process_index}, launcher said RANK={rank}")
    if state.is_main_process != (rank == 0):
        raise AssertionError("is_main_process disagrees with the process index")


def check_gather() -> None:
    """gather concatenates every process's tensor in rank order."""
    import torch

    from hasten.ops.collectives import gather

    state = _state()
    mine = torch.tensor([float(state.process_index)], device=state.device)
    result = gather(mine).cpu().tolist()
    if result != [float(i) for i in range(state.num_processes)]:
        raise AssertionError(f"gather returned {result}")


def check_reduce() -> None:
    """reduce(sum) adds every process's tensor."""
    import torch

    from hasten.ops.collectives import reduce

    state = _state()
    mine = torch.tensor([float(state.process_index + 1)], device=state.device)
    total = reduce(mine, reduction="sum").item()
    expected = state.num_processes * (state.num_processes + 1) / 2
    if total != expected:
        raise AssertionError(f"reduce(sum) returned {total}, expected {expected}")


def check_broadcast() -> None:
    """broadcast and broadcast_object_list copy the main process's data to everyone."""
    import torch

    from hasten.ops.collectives import broadcast, broadcast_object_list

    state = _state()
    tensor = torch.full((3,), float(state.process_index), device=state.device)
    if broadcast(tensor).cpu().tolist() != [0.0, 0.0, 0.0]:
        raise AssertionError("broadcast did not copy process 0's tensor")
    objects = broadcast_object_list([{"rank": state.process_index}])
    if objects != [{"rank": 0}]:
        raise AssertionError(f"broadcast_object_list returned {objects}")


def check_split_between_processes() -> None:
    """An uneven list splits into contiguous parts that together cover it exactly once."""
    from hasten.ops.collectives import gather_object

    state = _state()
    items = list(range(2 * state.num_processes + 1))
    with state.split_between_processes(items) as mine:
        parts = gather_object([list(mine)])
    merged = [item for part in parts for item in part]
    if merged != items:
        raise AssertionError(f"split_between_processes parts {parts} do not rebuild {items}")


def check_wait_for_everyone() -> None:
    """wait_for_everyone returns on every process."""
    _state().wait_for_everyone()


CHECKS: tuple[Callable[[], None], ...] = (
    check_state,
    check_gather,
    check_reduce,
    check_broadcast,
    check_split_between_processes,
    check_wait_for_everyone,
)


def _all_ok(ok: bool) -> bool:
    """Return True only if every process passed (falls back to this process's result)."""
    try:
        import torch

        from hasten.ops.collectives import reduce

        state = _state()
        failed = reduce(torch.tensor([0.0 if ok else 1.0], device=state.device), "sum")
        return bool(failed.item() == 0)
    except Exception:  # noqa: BLE001 - the per-check report already names the problem
        return ok


def main() -> int:
    """Run every check, print a report on the main process, return 0 only if all passed."""
    results: list[tuple[str, str | None]] = []
    for check in CHECKS:
        try:
            check()
            results.append((check.__name__, None))
        except Exception:  # noqa: BLE001 - report every failing check, not just the first
            results.append((check.__name__, traceback.format_exc()))
    ok = all(error is None for _, error in results)
    try:
        rank = _state().process_index
    except Exception:  # noqa: BLE001 - state unavailable: report from every process
        rank = 0
    for name, error in results:
        if error is not None:
            print(f"[process {rank}] FAIL {name}\n{error}", file=sys.stderr)
        elif rank == 0:
            print(f"PASS {name}")
    all_ok = _all_ok(ok)
    try:
        _state().destroy_process_group()
    except Exception:  # noqa: BLE001 - teardown is best effort
        pass
    return 0 if all_ok and ok else 1


if __name__ == "__main__":
    sys.exit(main())

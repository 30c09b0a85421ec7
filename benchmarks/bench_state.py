"""Cost of the process state on hot paths: constructing PartialState() and reading properties.

Hot code (data loaders, collectives, logging) creates `PartialState()` and reads
`is_main_process` / `num_processes` per batch, so both must cost well under a microsecond once
the state is set up. Compares hasten with HF Accelerate (if importable) and with reading a plain
attribute of an object (the floor). Prints nanoseconds per call and the ratio to the floor.

Usage: python benchmarks/bench_state.py [--number 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable
from typing import Any

from _reference import require_real_accelerate


def _median_ns(fn: Callable[[], Any], number: int, rounds: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=rounds)
    return statistics.median(times) / number * 1e9


def _cases(state_cls: Any) -> dict[str, Callable[[], Any]]:
    state = state_cls()
    return {
        "PartialState()": state_cls,
        "state.is_main_process": lambda: state.is_main_process,
        "state.num_processes": lambda: state.num_processes,
        "state.use_distributed": lambda: state.use_distributed,
        "state.device": lambda: state.device,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    class Plain:
        value = 0

    plain = Plain()
    floor = _median_ns(lambda: plain.value, args.number, args.rounds)

    from hasten.state import PartialState

    implementations = {"hasten": _cases(PartialState)}
    try:
        require_real_accelerate()
        from accelerate.state import PartialState as AcceleratePartialState
    except ImportError:
        pass
    else:
        implementations["accelerate"] = _cases(AcceleratePartialState)

    print(f"floor (plain attribute read through a lambda): {floor:.0f} ns")
    header = f"{'operation':<26}" + "".join(f"{name:>22}" for name in implementations)
    print(header)
    for case in implementations["hasten"]:
        cells = []
        for cases in implementations.values():
            ns = _median_ns(cases[case], args.number, args.rounds)
            cells.append(f"{ns:8.0f} ns ({ns / floor:4.1f}x)")
        print(f"{case:<26}" + "".join(f"{cell:>22}" for cell in cells))


if __name__ == "__main__":
    main()

"""Cost of one ``log`` call per training step, through hasten, raw libraries and Accelerate.

Each step logs ``{"loss": <0-d tensor>, "lr": float, "epoch": int}`` with a step number:

- TensorBoard: hasten's TensorBoardTracker vs a raw SummaryWriter (add_scalar per value +
  flush, what the tracker does) vs Accelerate's TensorBoardTracker (if importable);
- the built-in JSONL tracker (one flushed line per call) vs a raw ``json.dumps`` + write + flush;
- the whole Accelerator path (``accelerator.log``) with the JSONL tracker, and with no tracker.

Implementations are interleaved round by round and the median round is reported (shared machine).

Usage: python benchmarks/bench_tracking.py [--steps 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _reference import require_real_accelerate

Runner = Callable[[Path, int], None]


def _values(step: int) -> dict[str, Any]:
    return {"loss": torch.tensor(1.0 / (step + 1)), "lr": 1e-3, "epoch": step // 100}


def hasten_tensorboard(root: Path, steps: int) -> None:
    from hasten.tracking.tensorboard import TensorBoardTracker

    tracker = TensorBoardTracker("run", root)
    tracker.start()
    for step in range(steps):
        tracker.log(_values(step), step=step)
    tracker.finish()


def raw_tensorboard(root: Path, steps: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(root / "run"))
    for step in range(steps):
        for key, value in _values(step).items():
            writer.add_scalar(key, value.item() if isinstance(value, torch.Tensor) else value, step)
        writer.flush()
    writer.close()


def accelerate_tensorboard(root: Path, steps: int) -> None:
    from accelerate.state import PartialState
    from accelerate.tracking import TensorBoardTracker

    PartialState()
    tracker = TensorBoardTracker("run", str(root))
    tracker.start()
    for step in range(steps):
        tracker.log(_values(step), step=step)
    tracker.finish()


def hasten_jsonl(root: Path, steps: int) -> None:
    from hasten.tracking.jsonl import JSONLTracker

    tracker = JSONLTracker("run", root)
    tracker.start()
    for step in range(steps):
        tracker.log(_values(step), step=step)
    tracker.finish()


def raw_jsonl(root: Path, steps: int) -> None:
    with (root / "metrics.jsonl").open("a") as handle:
        for step in range(steps):
            values = {
                k: v.item() if isinstance(v, torch.Tensor) else v for k, v in _values(step).items()
            }
            handle.write(json.dumps({"step": step, "time": time.time(), "values": values}) + "\n")
            handle.flush()


def _accelerator_log(log_with: Any) -> Runner:
    def run(root: Path, steps: int) -> None:
        from hasten import Accelerator
        from hasten.state._shared import reset_state

        reset_state()
        acc = Accelerator(cpu=True, log_with=log_with, project_dir=str(root))
        acc.init_trackers("run")
        for step in range(steps):
            acc.log(_values(step), step=step)
        acc.end_training()

    return run


def _time(fn: Runner, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        fn(Path(tmp), steps)
        return (time.perf_counter() - start) / steps


def _compare(
    title: str, runners: dict[str, Runner], baseline: str, steps: int, rounds: int
) -> None:
    for fn in runners.values():
        _time(fn, 50)  # warm up imports and caches
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            samples[name].append(_time(fn, steps))
    base = statistics.median(samples[baseline])
    print(f"== {title} ({steps} log calls, median of {rounds} rounds)")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"  {name:<22} {median * 1e6:8.1f} us/call   x{median / base:5.2f} vs {baseline}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tensorboard: dict[str, Runner] = {
        "raw SummaryWriter": raw_tensorboard,
        "hasten": hasten_tensorboard,
    }
    try:
        require_real_accelerate()
        import accelerate.tracking  # noqa: F401

        tensorboard["accelerate"] = accelerate_tensorboard
    except ImportError:
        print("(accelerate not importable: skipping its column)")
    _compare("TensorBoard", tensorboard, "raw SummaryWriter", args.steps, args.rounds)
    jsonl = {"raw json+flush": raw_jsonl, "hasten jsonl": hasten_jsonl}
    _compare("built-in JSONL", jsonl, "raw json+flush", args.steps, args.rounds)
    facade = {"no tracker": _accelerator_log(None), "jsonl": _accelerator_log("jsonl")}
    _compare("accelerator.log", facade, "no tracker", args.steps, args.rounds)


if __name__ == "__main__":
    main()

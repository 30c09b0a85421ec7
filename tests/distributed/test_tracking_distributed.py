"""Trackers on 2 forked processes: only the main process creates runs, files and imports libraries."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from _support.distributed import run_distributed
from hasten.core.imports import is_package_available
from hasten.tracking.base import GeneralTracker, on_main_process

pytestmark = pytest.mark.distributed


class EverywhereTracker(GeneralTracker):
    """A custom tracker that asks to run on every process."""

    name = "everywhere"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[dict[str, Any], int | None]] = []

    @property
    def tracker(self) -> list[tuple[dict[str, Any], int | None]]:
        return self.logged

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.logged.append((values, step))


class DecoratedTracker(GeneralTracker):
    """A custom tracker written the Accelerate way: methods guarded by @on_main_process."""

    name = "decorated"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[int | None] = []

    @property
    def tracker(self) -> list[int | None]:
        return self.logged

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.logged.append(step)


def _decorated_direct_use() -> list[int | None]:
    from hasten import PartialState

    PartialState()
    tracker = DecoratedTracker()  # used directly on every process, without an Accelerator
    for step in range(2):
        tracker.log({"loss": 1.0}, step=step)
    return tracker.logged


@pytest.mark.timeout(120)
def test_on_main_process_methods_run_on_the_main_process_only() -> None:
    main, other = run_distributed(_decorated_direct_use, world_size=2, timeout=90)
    assert (main, other) == ([0, 1], [])


def _train_and_log(project_dir: str, names: list[str]) -> dict[str, Any]:
    # Forget the tracking libraries the parent imported, to see whether this process imports them.
    for module in [
        m for m in sys.modules if m.startswith(("torch.utils.tensorboard", "tensorboard"))
    ]:
        del sys.modules[module]
    from hasten import Accelerator

    everywhere = EverywhereTracker()
    acc = Accelerator(cpu=True, log_with=[*names, everywhere], project_dir=project_dir)
    acc.init_trackers("proj", config={"lr": 0.1, "world": acc.num_processes})
    for step in range(3):
        acc.log({"loss": 1.0 / (step + 1), "rank": acc.process_index}, step=step)
    running = [t.name for t in acc.trackers]
    absent_call = acc.get_tracker("jsonl", unwrap=True)
    acc.end_training()
    return {
        "main": acc.is_main_process,
        "running": running,
        "absent": type(absent_call).__name__,
        "everywhere": [step for _values, step in everywhere.logged],
        "tensorboard_imported": "torch.utils.tensorboard" in sys.modules,
    }


@pytest.mark.timeout(120)
def test_only_the_main_process_creates_runs_and_files(tmp_path: Path) -> None:
    names = ["jsonl"] + (["tensorboard"] if is_package_available("tensorboard") else [])
    main, other = run_distributed(_train_and_log, str(tmp_path), names, world_size=2, timeout=90)

    assert main["main"] and not other["main"]
    assert main["running"] == [*names, "everywhere"]
    assert other["running"] == ["everywhere"]
    assert other["absent"] == "AbsentTracker"
    assert main["everywhere"] == other["everywhere"] == [0, 1, 2]
    assert not other["tensorboard_imported"]

    run_dir = tmp_path / "proj"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["values"]["rank"]) for r in records] == [(0, 0), (1, 0), (2, 0)]
    assert json.loads((run_dir / "config.json").read_text()) == {"lr": 0.1, "world": 2}
    if "tensorboard" in names:
        assert main["tensorboard_imported"]
        assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert sorted(
        p.name for p in tmp_path.rglob("*") if p.is_file() and "tfevents" not in p.name
    ) == sorted(
        ["config.json", "metrics.jsonl"]
        # TensorBoard's hparams, in the run's timestamped subfolder (as Accelerate writes them)
        + (["hparams.yml"] if "tensorboard" in names else [])
    )


def _log_before_init(project_dir: str) -> list[str]:
    from hasten import Accelerator

    acc = Accelerator(cpu=True, log_with="jsonl", project_dir=project_dir)
    outcomes = []
    for started in (False, True):
        # diffusers' example scripts: trackers started on the main process only, log everywhere
        if started and acc.is_main_process:
            acc.init_trackers("run")
        try:
            acc.log({"loss": 1.0})
        except RuntimeError as err:
            outcomes.append(str(err))
        else:
            outcomes.append("no error")
    acc.end_training()
    return outcomes


@pytest.mark.timeout(120)
def test_log_before_init_fails_where_the_trackers_run(tmp_path: Path) -> None:
    main, other = run_distributed(_log_before_init, str(tmp_path), world_size=2, timeout=90)
    assert "before init_trackers()" in main[0] and main[1] == "no error"
    assert other == ["no error", "no error"]  # jsonl runs on the main process only

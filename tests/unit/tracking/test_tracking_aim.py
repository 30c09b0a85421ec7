"""Aim against the real library: a local repository, indexed and read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from hasten.core.imports import is_package_available
from hasten.tracking.manager import TrackerManager

pytestmark = pytest.mark.skipif(not is_package_available("aim"), reason="aim is an optional extra")


def test_repository_holds_metrics_and_hparams(tmp_path: Path) -> None:
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    manager = TrackerManager("aim", tmp_path, is_main_process=True)
    manager.init(
        "proj",
        config={"lr": 0.01, "optimizer": {"name": "adam"}},
        init_kwargs={
            "aim": {
                "system_tracking_interval": None,
                "log_system_params": False,
                "capture_terminal_logs": False,
            }
        },
    )
    run_hash = manager.get("aim", unwrap=True).hash
    for step in (0, 10, 20):
        manager.log({"loss": 1.0 / (step + 1)}, step=step)
    manager.finish()

    repo = Repo(str(tmp_path))
    RepoIndexManager.get_index_manager(repo).index(run_hash)
    (run,) = list(Repo(str(tmp_path)).iter_runs())
    assert run.name == "proj"
    assert run["hparams"] == {"lr": 0.01, "optimizer": {"name": "adam"}}
    (metric,) = list(run.metrics())
    assert metric.name == "loss"
    steps, (values, *_rest) = metric.data.items_list()
    assert list(steps) == [0, 10, 20]
    assert list(values) == pytest.approx([1.0, 1 / 11, 1 / 21])

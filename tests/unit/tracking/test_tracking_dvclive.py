"""DVCLive against the real library: metrics TSVs and params.yaml in a local folder."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from hasten.core.imports import is_package_available
from hasten.tracking.dvclive import DVCLiveTracker
from hasten.tracking.manager import TrackerManager

pytestmark = pytest.mark.skipif(
    not is_package_available("dvclive"), reason="dvclive is an optional extra"
)


def metrics_dir(out: Path) -> Path:
    return out / "plots" / "metrics"


def _tsv_text(path: Path) -> list[tuple[int, str]]:
    with path.open() as handle:
        return [
            (int(row["step"]), row[path.stem]) for row in csv.DictReader(handle, delimiter="\t")
        ]


def _tsv(path: Path) -> list[tuple[int, float]]:
    with path.open() as handle:
        return [
            (int(row["step"]), float(row[path.stem]))
            for row in csv.DictReader(handle, delimiter="\t")
        ]


def test_metrics_and_params_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # DVCLive writes dvc.yaml in the working directory
    out = tmp_path / "live"
    manager = TrackerManager("dvclive", is_main_process=True)
    manager.init(
        "proj",
        config={"lr": 0.01, "optimizer": {"name": "adam"}},
        init_kwargs={"dvclive": {"dir": str(out), "save_dvc_exp": False}},
    )
    for step in (0, 5, 10):
        manager.log({"loss": 1.0 / (step + 1), "acc": step / 10}, step=step)
    # a string is a DVCLive metric too (as Accelerate logs it); a list is not: skipped
    with pytest.warns(UserWarning, match=r"dvclive tracker skipped 'sizes': got a list"):
        manager.log({"text": "x", "loss": 0.01, "sizes": [1, 2]})  # no step: DVCLive's counter
    manager.finish()
    assert _tsv_text(metrics_dir(out) / "text.tsv") == [(11, "x")]

    metrics = metrics_dir(out)
    assert _tsv(metrics / "loss.tsv") == [
        (0, 1.0),
        (5, pytest.approx(1 / 6)),
        (10, pytest.approx(1 / 11)),
        (11, 0.01),
    ]
    assert _tsv(metrics / "acc.tsv") == [(0, 0.0), (5, 0.5), (10, 1.0)]
    assert yaml.safe_load((out / "params.yaml").read_text()) == {
        "lr": 0.01,
        "optimizer": {"name": "adam"},
    }


def test_existing_live_object_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dvclive import Live

    monkeypatch.chdir(tmp_path)
    live = Live(dir=str(tmp_path / "mine"), save_dvc_exp=False)
    tracker = DVCLiveTracker(live=live)
    tracker.start()
    assert tracker.tracker is live
    tracker.log({"loss": 0.5}, step=2)
    tracker.finish()
    assert _tsv(tmp_path / "mine" / "plots" / "metrics" / "loss.tsv") == [(2, 0.5)]

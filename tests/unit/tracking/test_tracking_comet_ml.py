"""Comet against the real library in offline mode: unpack the offline archive and read it back."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hasten.core.imports import is_package_available
from hasten.tracking.manager import TrackerManager

pytestmark = [
    pytest.mark.skipif(
        not is_package_available("comet_ml"), reason="comet_ml is an optional extra"
    ),
    # comet_ml triggers deprecation warnings of its own dependencies (pyparsing, sentry_sdk).
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _messages(archive: Path) -> list[dict[str, Any]]:
    with zipfile.ZipFile(archive) as zipped:
        lines = zipped.read("messages.json").decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_offline_archive_holds_metrics_params_and_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Set before the first import: comet_ml otherwise hooks MLflow and other libraries.
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")
    import comet_ml

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("COMET_API_KEY", raising=False)
    quiet = comet_ml.ExperimentConfig(
        offline_directory=str(tmp_path / "comet"),
        log_code=False,
        log_git_metadata=False,
        log_git_patch=False,
        log_env_details=False,
        log_env_gpu=False,
        log_env_host=False,
        log_env_cpu=False,
        log_env_network=False,
        log_env_disk=False,
        auto_output_logging=False,
        display_summary_level=0,
    )
    manager = TrackerManager("comet_ml", is_main_process=True)
    manager.init(
        "proj",
        config={"lr": 0.01, "optimizer": {"name": "adam"}},
        init_kwargs={"comet_ml": {"online": False, "experiment_config": quiet}},
    )
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1), "phase": "train"}, step=step)
    manager.log({"eval": {"acc": 0.75}}, step=3)
    manager.finish()

    (archive,) = (tmp_path / "comet").glob("*.zip")
    messages = _messages(archive)
    metrics = [
        (
            m["payload"]["metric"]["metricName"],
            m["payload"]["metric"]["step"],
            m["payload"]["metric"]["metricValue"],
        )
        for m in messages
        if m["type"] == "metric_msg"
        and not m["payload"]["metric"]["metricName"].startswith(("sys", "process"))
    ]
    assert metrics == [
        ("loss", 0, 1.0),
        ("loss", 1, 0.5),
        ("loss", 2, pytest.approx(1 / 3)),
        ("eval_acc", 3, 0.75),
    ]
    params = {
        m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg"
        and m["payload"]["param"]["source"] == "manual"
        and m["payload"]["param"]["paramName"] != "curr_step"
    }
    assert params == {"lr": 0.01, "optimizer|name": "adam"}
    others = {
        m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"
    }
    assert others["phase"] == "train"

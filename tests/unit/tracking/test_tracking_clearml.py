"""ClearML against the real library in offline mode: read the offline session folder back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hasten.core.imports import is_package_available
from hasten.tracking.clearml import title_and_series
from hasten.tracking.manager import TrackerManager

pytestmark = [
    pytest.mark.skipif(not is_package_available("clearml"), reason="clearml is an optional extra"),
    # clearml triggers deprecation warnings of its own dependencies (pyparsing, sentry_sdk).
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

_FRAMEWORKS = [
    "matplotlib",
    "tensorflow",
    "tensorboard",
    "pytorch",
    "xgboost",
    "scikit",
    "fastai",
    "lightgbm",
    "hydra",
    "detect_repository",
    "tfdefines",
    "joblib",
    "megengine",
    "catboost",
    "gradio",
]


def test_title_and_series_split() -> None:
    assert title_and_series("eval_loss") == ("loss", "eval")
    assert title_and_series("test_acc") == ("acc", "test")
    assert title_and_series("train_loss") == ("loss", "train")
    assert title_and_series("loss") == ("loss", "train")
    assert title_and_series("evaluation") == ("evaluation", "train")


def test_offline_session_holds_scalars_and_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clearml import Task

    monkeypatch.setenv("HOME", str(tmp_path))
    # Report from a thread instead of a subprocess: closing then takes 0.2 s instead of 7 s.
    conf = tmp_path / "clearml.conf"
    conf.write_text("sdk { development { report_use_subprocess: false } }\n")
    monkeypatch.setenv("CLEARML_CONFIG_FILE", str(conf))
    monkeypatch.delenv("CLEARML_PROJECT", raising=False)
    monkeypatch.delenv("CLEARML_TASK", raising=False)
    # Offline mode is process-wide and cannot be switched back without a server; it stays on.
    Task.set_offline(offline_mode=True)
    manager = TrackerManager("clearml", is_main_process=True)
    manager.init(
        "proj",
        config={"lr": 0.01, "optimizer": {"name": "adam"}},
        init_kwargs={
            "clearml": {
                # No repository/requirements scan (slow) and no patching of other libraries.
                "auto_connect_frameworks": dict.fromkeys(_FRAMEWORKS, False),
                "auto_resource_monitoring": False,
                "auto_connect_streams": False,
            }
        },
    )
    task = manager.get("clearml", unwrap=True)
    assert task.name == "proj"
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1), "eval_acc": step / 4}, step=step)
    with pytest.warns(UserWarning, match=r"clearml tracker skipped 'text'"):
        manager.log({"text": "x", "final": 0.5})  # no step: a single value
    manager.finish()

    (session,) = [p for p in (tmp_path / ".clearml" / "cache" / "offline").iterdir() if p.is_dir()]
    events = [
        e for line in (session / "metrics.jsonl").read_text().splitlines() for e in json.loads(line)
    ]
    scalars = [
        (e["metric"], e["variant"], e["iter"], e["value"])
        for e in events
        if e["type"] == "training_stats_scalar"
    ]
    assert sorted(scalars) == sorted(
        [("loss", "train", s, pytest.approx(1 / (s + 1))) for s in range(3)]
        + [("acc", "eval", s, s / 4) for s in range(3)]
        + [("Summary", "final", -(2**31), 0.5)]  # how ClearML stores a single value
    )
    task_json = json.loads((session / "task.json").read_text())
    assert "adam" in json.dumps(task_json)

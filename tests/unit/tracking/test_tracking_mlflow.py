"""MLflow against the real library: a local file store, read back through MlflowClient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hasten.core.imports import is_package_available
from hasten.tracking.manager import TrackerManager
from hasten.tracking.mlflow import MLflowTracker

pytestmark = pytest.mark.skipif(
    not is_package_available("mlflow"), reason="mlflow (or mlflow-skinny) is an optional extra"
)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    # MLflow 3 keeps the file store behind this switch; the sqlite store would need SQLAlchemy.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # comet_ml, once imported by another test, mirrors MLflow runs into ./.cometml-runs.
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS"):
        monkeypatch.delenv(name, raising=False)
    return (tmp_path / "mlruns").as_uri()


def test_params_and_metrics_read_back(store: str) -> None:
    import mlflow

    manager = TrackerManager("mlflow", is_main_process=True)
    manager.init(
        "my-experiment",
        config={"lr": 0.01, "optimizer": {"name": "adam", "betas": [0.9, 0.99]}, "seed": None},
        init_kwargs={"mlflow": {"logging_dir": store, "run_name": "r1", "tags": '{"team": "a"}'}},
    )
    run_id = manager.get("mlflow", unwrap=True).info.run_id
    for step in range(4):
        manager.log({"loss": torch.tensor(1.0 / (step + 1)), "acc": step * 0.25}, step=step)
    with pytest.warns(UserWarning, match=r"mlflow tracker skipped 'text': got a str"):
        manager.log({"text": "not a metric", "acc": 1.0}, step=4)
    manager.finish()
    assert mlflow.active_run() is None

    client = mlflow.MlflowClient(tracking_uri=store)
    run = client.get_run(run_id)
    assert run.info.run_name == "r1"
    assert run.data.tags["team"] == "a"
    assert client.get_experiment(run.info.experiment_id).name == "my-experiment"
    assert run.data.params == {
        "lr": "0.01",
        "optimizer.name": "adam",
        "optimizer.betas": "[0.9, 0.99]",
        "seed": "None",
    }
    loss = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in loss] == [
        (0, 1.0),
        (1, 0.5),
        (2, pytest.approx(1 / 3)),
        (3, 0.25),
    ]
    acc = client.get_metric_history(run_id, "acc")
    assert [(m.step, m.value) for m in acc] == [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert "text" not in run.data.metrics


def test_environment_overrides_arguments(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_TAGS", '{"k": "v"}')
    tracker = MLflowTracker("from-arg", logging_dir="/elsewhere", tags={"k": "arg"})
    assert (tracker.experiment_name, tracker.logging_dir, tracker.tags) == (
        "from-env",
        store,
        {"k": "v"},
    )


def test_bad_tags_string_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"MLflow tags must be a dict or a JSON object string, got 'team=a'"
    ):
        MLflowTracker("x", tags="team=a")
    with pytest.raises(ValueError, match=r"must be a JSON object, got '\[1\]'"):
        MLflowTracker("x", tags="[1]")


def test_resume_existing_experiment_and_long_params(store: str) -> None:
    import mlflow
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    first = MLflowTracker("exp", logging_dir=store)
    first.start()
    first.finish()
    second = MLflowTracker("exp", logging_dir=store)
    second.start()
    with pytest.warns(UserWarning, match=r"skipped 'blob'"):
        second.store_init_configuration({"blob": "x" * (MAX_PARAM_VAL_LENGTH + 1), "ok": 1})
    run_id = second.tracker.info.run_id
    second.finish()
    client = mlflow.MlflowClient(tracking_uri=store)
    assert client.get_run(run_id).data.params == {"ok": "1"}
    assert len(client.search_experiments(filter_string="name = 'exp'")) == 1


def test_log_images_become_run_images(store: str) -> None:
    import mlflow
    import numpy as np

    tracker = MLflowTracker("img-exp", logging_dir=store)
    tracker.start()
    tracker.log_images({"sample": np.zeros((8, 8, 3), dtype=np.uint8)}, step=2)
    run_id = tracker.tracker.info.run_id
    tracker.finish()
    client = mlflow.MlflowClient(tracking_uri=store)
    names = [a.path for a in client.list_artifacts(run_id, "images")]
    assert any(n.startswith("images/sample+step+2+") and n.endswith(".png") for n in names), names

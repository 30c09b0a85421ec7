"""W&B against the real library in offline mode: the offline run folder must hold the history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.core.imports import is_package_available
from hasten.tracking.manager import TrackerManager
from unit.tracking._tracking_records import iter_records

pytestmark = pytest.mark.skipif(
    not is_package_available("wandb"), reason="wandb is an optional extra"
)


def _read_run(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from wandb.proto import wandb_internal_pb2

    (log_file,) = run_dir.glob("run-*.wandb")
    history: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for data in iter_records(log_file, b":W&B"):
        record = wandb_internal_pb2.Record.FromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
            )
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    return history, config


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


def test_offline_run_holds_history_and_config(offline: Path) -> None:
    import wandb

    manager = TrackerManager("wandb", is_main_process=True)
    manager.init(
        "proj",
        config={"lr": 0.01, "optimizer": {"name": "adam"}},
        init_kwargs={"wandb": {"mode": "offline", "dir": str(offline), "tags": ["t1"]}},
    )
    run = manager.get("wandb", unwrap=True)
    for step in range(0, 30, 10):
        manager.log({"loss": torch.tensor(1.0 / (step + 1)), "acc": step / 100}, step=step)
    with pytest.warns(UserWarning, match=r"wandb tracker skipped 'bad': got a object"):
        manager.log({"bad": object(), "acc": 0.25}, step=25)  # W&B alone would raise TypeError
    tracker = manager.get("wandb")
    tracker.log_table("preds", columns=["x", "y"], data=[[1, 2], [3, 4]], step=30)
    with pytest.raises(ValueError, match=r"log_table\('empty'\) got neither data nor dataframe"):
        tracker.log_table("empty")
    manager.finish()
    # wandb-core writes the transaction log on its own schedule; stopping the service flushes it.
    wandb.teardown()

    (run_dir,) = (offline / "wandb").glob("offline-run-*")
    assert run_dir.name.endswith(run.id)
    history, config = _read_run(run_dir)
    metrics = [
        {k: v for k, v in row.items() if not k.startswith("_")} | {"_step": row["_step"]}
        for row in history
    ]
    assert metrics[:3] == [
        {"loss": 1.0, "acc": 0.0, "_step": 0},
        {"loss": pytest.approx(1 / 11), "acc": 0.1, "_step": 10},
        {"loss": pytest.approx(1 / 21), "acc": 0.2, "_step": 20},
    ]
    assert metrics[3] == {"acc": 0.25, "_step": 25}
    assert metrics[4]["_step"] == 30
    assert metrics[4]["preds/_type"] == "table-file"
    assert metrics[4]["preds/nrows"] == 2
    assert config == {"lr": 0.01, "optimizer": {"name": "adam"}}

"""SwanLab against the real library in offline mode: read the run's record file and config back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hasten.core.imports import is_package_available
from hasten.tracking.manager import TrackerManager
from unit.tracking._tracking_records import iter_records

pytestmark = pytest.mark.skipif(
    not is_package_available("swanlab"), reason="swanlab is an optional extra"
)


def test_offline_run_holds_scalars_and_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    manager = TrackerManager("swanlab", is_main_process=True)
    manager.init(
        "proj",
        config={"lr": 0.01, "optimizer": {"name": "adam"}},
        init_kwargs={"swanlab": {"mode": "offline", "logdir": str(tmp_path / "logs")}},
    )
    for step in range(0, 30, 10):
        manager.log({"loss": 1.0 / (step + 1)}, step=step)
    with pytest.warns(UserWarning, match=r"swanlab tracker skipped 'names': got a list"):
        manager.log({"names": ["a"], "loss": 0.01}, step=30)
    manager.finish()

    (run_dir,) = (tmp_path / "logs").glob("run-*")
    config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert config["lr"]["value"] == 0.01
    assert config["optimizer"]["value"] == {"name": "adam"}
    (record_file,) = run_dir.glob("run-*.swanlab")
    scalars = [
        (rec.scalar.key, rec.scalar.step, rec.scalar.value.number)
        for rec in map(Record.FromString, iter_records(record_file, b":SWL"))
        if rec.HasField("scalar")
    ]
    assert scalars == [
        ("loss", 0, 1.0),
        ("loss", 10, pytest.approx(1 / 11)),
        ("loss", 20, pytest.approx(1 / 21)),
        ("loss", 30, 0.01),
    ]

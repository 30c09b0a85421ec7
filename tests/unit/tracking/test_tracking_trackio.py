"""Trackio against the real library: its local SQLite database, read back."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from hasten.core.imports import is_package_available
from hasten.tracking.manager import TrackerManager

pytestmark = pytest.mark.skipif(
    not is_package_available("trackio"), reason="trackio is an optional extra"
)


def test_local_database_holds_metrics_and_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Trackio fixes its folder when imported: import it afresh with TRACKIO_DIR pointing here.
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in [m for m in sys.modules if m == "trackio" or m.startswith("trackio.")]:
        monkeypatch.delitem(sys.modules, name)
    import trackio
    import trackio.utils

    assert tmp_path == trackio.utils.TRACKIO_DIR
    manager = TrackerManager("trackio", is_main_process=True)
    manager.init(
        "proj",
        config={"lr": 0.01},
        init_kwargs={"trackio": {"embed": False, "auto_log_gpu": False, "auto_log_cpu": False}},
    )
    for step in (0, 10, 20):
        manager.log({"loss": 1.0 / (step + 1), "phase": "train"}, step=step)
    with pytest.warns(UserWarning, match=r"trackio tracker skipped 'obj'"):
        manager.log({"obj": object()}, step=30)
    tracker = manager.get("trackio")
    tracker.log_images({"sample": (np.zeros((8, 8, 3), dtype=np.uint8), "blank")}, step=40)
    tracker.log_table("preds", columns=["x", "y"], data=[[1, 2]], step=50)
    manager.finish()
    # Finished as trackio.finish() does: no current run left for Trackio's exit hook to finish
    # again (it printed "Uploading logs to Trackio" at interpreter exit).
    assert capsys.readouterr().out.count("Run finished") == 1
    with pytest.raises(RuntimeError, match=r"Call trackio.init\(\) before trackio.log"):
        trackio.log({"loss": 0.0})

    with sqlite3.connect(tmp_path / "proj.db") as db:
        rows = db.execute("SELECT step, metrics FROM metrics ORDER BY step").fetchall()
        (config,) = db.execute("SELECT config FROM configs").fetchall()
    logged = [(step, json.loads(metrics)) for step, metrics in rows]
    assert logged[:3] == [
        (0, {"loss": 1.0, "phase": "train"}),
        (10, {"loss": pytest.approx(1 / 11), "phase": "train"}),
        (20, {"loss": pytest.approx(1 / 21), "phase": "train"}),
    ]
    assert json.loads(config[0])["lr"] == 0.01
    image = dict(logged)[40]["sample"]
    assert (image["_type"], image["caption"]) == ("trackio.image", "blank")
    assert (tmp_path / "media" / image["file_path"]).is_file()
    assert dict(logged)[50]["preds"] == {"_type": "trackio.table", "_value": [{"x": 1, "y": 2}]}

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from hasten.tracking.jsonl import CONFIG_FILE, METRICS_FILE, JSONLTracker, read_metrics


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_log_is_one_flushed_line(tmp_path: Path) -> None:
    tracker = JSONLTracker("proj", tmp_path)
    tracker.start()
    path = tmp_path / "proj" / METRICS_FILE
    assert tracker.path == path
    tracker.log({"loss": torch.tensor(0.5), "lr": 1e-3, "phase": "train"}, step=3)
    # Read while the file is still open: the line must already be on disk.
    (line,) = _lines(path)
    assert line["step"] == 3
    assert line["values"] == {"loss": 0.5, "lr": 1e-3, "phase": "train"}
    assert abs(line["time"] - __import__("time").time()) < 60
    tracker.log({"loss": 0.25})
    assert [rec["step"] for rec in _lines(path)] == [3, None]
    tracker.finish()
    assert tracker.tracker is None


def test_nested_values_are_flattened_and_bad_ones_skipped_once(tmp_path: Path) -> None:
    tracker = JSONLTracker("proj", tmp_path)
    tracker.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            tracker.log(
                {"eval": {"acc": 0.5, "f1": 0.25}, "hist": [1, 2], "w": torch.ones(3)}, step=step
            )
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2  # one for 'hist', one for 'w', not one per step
    assert "jsonl tracker skipped 'hist': got a list" in messages[0]
    assert "jsonl tracker skipped 'w': got a Tensor" in messages[1]
    records = _lines(tracker.path)
    assert records[2]["values"] == {"eval/acc": 0.5, "eval/f1": 0.25}
    tracker.finish()


def test_config_json_written_beside_metrics(tmp_path: Path) -> None:
    tracker = JSONLTracker("proj", tmp_path)
    tracker.start()
    tracker.store_init_configuration({"lr": 0.1, "opt": {"name": "adam"}, "dtype": torch.float16})
    saved = json.loads((tmp_path / "proj" / CONFIG_FILE).read_text())
    assert saved == {"lr": 0.1, "opt": {"name": "adam"}, "dtype": "torch.float16"}
    assert not list((tmp_path / "proj").glob(".*tmp"))
    tracker.finish()


def test_fsync_option_syncs_every_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    tracker = JSONLTracker("proj", tmp_path, fsync=True)
    tracker.start()
    tracker.log({"a": 1}, step=0)
    tracker.log({"a": 2}, step=1)
    tracker.finish()
    assert len(synced) == 2
    plain = JSONLTracker("plain", tmp_path)
    plain.start()
    plain.log({"a": 1})
    plain.finish()
    assert len(synced) == 2


def test_resumed_run_appends_and_survives_a_cut_line(tmp_path: Path) -> None:
    first = JSONLTracker("proj", tmp_path)
    first.start()
    first.log({"loss": 1.0}, step=0)
    first.finish()
    with first.path.open("a") as handle:  # a crash in the middle of writing a line
        handle.write('{"step": 1, "time": 5.0, "val')
    second = JSONLTracker("proj", tmp_path)
    second.start()
    second.log({"loss": 0.5}, step=2)
    second.finish()
    with pytest.warns(UserWarning, match=r"skipped 1 line\(s\) .*lines \[2\]"):
        records = read_metrics(first.path)
    assert [(r["step"], r["values"]["loss"]) for r in records] == [(0, 1.0), (2, 0.5)]


def test_log_when_not_open_is_an_error(tmp_path: Path) -> None:
    tracker = JSONLTracker("proj", tmp_path)
    with pytest.raises(RuntimeError, match=r"JSONLTracker\('proj'\) is not open: call start\(\)"):
        tracker.log({"a": 1})
    tracker.start()
    tracker.finish()
    with pytest.raises(RuntimeError, match="do not log after finish"):
        tracker.log({"a": 1})


def test_read_metrics_skips_non_records(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 0, "time": 1.0, "values": {"a": 1}}\n[1, 2]\n\n{"no": "values"}\n')
    with pytest.warns(UserWarning, match=r"skipped 2 line\(s\)"):
        assert read_metrics(path) == [{"step": 0, "time": 1.0, "values": {"a": 1}}]

"""``hasten plot``: find metrics.jsonl files, gather numeric series, draw a PNG, fail clearly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.commands import plot
from hasten.core.imports import install_command, is_package_available
from hasten.tracking.jsonl import JSONLTracker

pytestmark = pytest.mark.cli

needs_matplotlib = pytest.mark.skipif(
    not is_package_available("matplotlib"), reason="matplotlib is the optional 'plot' extra"
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(logging_dir: Path, project: str, steps: int = 5) -> Path:
    tracker = JSONLTracker(project, logging_dir)
    tracker.start()
    for step in range(steps):
        tracker.log({"loss": 1.0 / (step + 1), "phase": "train"}, step=step)
        if step % 2:
            tracker.log({"eval": {"acc": step / 10}}, step=step)
    tracker.log({"final": 7.0})  # no step: placed at its line index
    tracker.finish()
    return logging_dir / project


def test_find_metric_files_file_dir_and_tree(tmp_path: Path) -> None:
    one = _run(tmp_path, "a")
    two = _run(tmp_path, "b")
    assert plot.find_metric_files(one / "metrics.jsonl") == [one / "metrics.jsonl"]
    assert plot.find_metric_files(one) == [one / "metrics.jsonl"]
    assert plot.find_metric_files(tmp_path) == [one / "metrics.jsonl", two / "metrics.jsonl"]


def test_find_metric_files_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"'.*missing' does not exist"):
        plot.find_metric_files(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"no metrics.jsonl under .*log_with='jsonl'"):
        plot.find_metric_files(tmp_path)


def test_load_series_keeps_numeric_metrics_per_run(tmp_path: Path) -> None:
    _run(tmp_path, "a", steps=4)
    _run(tmp_path, "b", steps=2)
    series = plot.load_series(plot.find_metric_files(tmp_path), tmp_path)
    assert sorted(series) == ["eval/acc", "final", "loss"]  # "phase" is text: not plotted
    assert series["loss"]["a"] == ([0.0, 1.0, 2.0, 3.0], [1.0, 0.5, pytest.approx(1 / 3), 0.25])
    assert series["eval/acc"]["a"] == ([1.0, 3.0], [0.1, 0.3])
    assert series["loss"]["b"] == ([0.0, 1.0], [1.0, 0.5])
    assert series["final"]["b"] == ([3.0], [7.0])  # 4th line of b's file


@needs_matplotlib
def test_plot_metrics_writes_png(tmp_path: Path) -> None:
    run = _run(tmp_path, "proj")
    target = plot.plot_metrics(run)
    assert target == run / "metrics.png"
    assert target.read_bytes()[:8] == PNG_MAGIC
    custom = plot.plot_metrics(run / "metrics.jsonl", tmp_path / "out" / "curves.png")
    assert custom.read_bytes()[:8] == PNG_MAGIC


def test_no_numeric_metrics_is_a_clear_error(tmp_path: Path) -> None:
    run = tmp_path / "proj"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "time": 1.0, "values": {"note": "hi"}}) + "\n"
    )
    with pytest.raises(ValueError, match="hold no numeric metrics"):
        plot.plot_metrics(run)


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, "proj")
    is_package_available.cache_clear()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an uninstalled package looks like
    try:
        with pytest.raises(
            ImportError,
            match=r"hasten plot requires 'matplotlib'.*"
            + re.escape(install_command("matplotlib", "plot")),
        ):
            plot.plot_metrics(run)
    finally:
        is_package_available.cache_clear()


@needs_matplotlib
def test_hasten_plot_command_end_to_end(tmp_path: Path) -> None:
    _run(tmp_path, "proj")
    out = tmp_path / "metrics.png"
    done = subprocess.run(
        [sys.executable, "-m", "hasten.commands.cli", "plot", str(tmp_path), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_hasten_plot_reports_errors_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hasten.commands.cli import main

    assert main(["plot", str(tmp_path)]) == 2
    assert f"hasten plot: error: no metrics.jsonl under '{tmp_path}'" in capsys.readouterr().err

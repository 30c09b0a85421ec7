"""``hasten plot <run_dir> [-o file.png]``: draw the curves logged by the built-in "jsonl" tracker.

Reads every ``metrics.jsonl`` at or under ``run_dir`` (a project folder, or the logging folder
holding several projects) and draws one panel per numeric metric against the step, one line
per run. Needs matplotlib (``pip install 'hasten[plot]'``); it renders off-screen (Agg).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from hasten.core.imports import require
from hasten.tracking.jsonl import METRICS_FILE, read_metrics

__all__ = ["Series", "find_metric_files", "load_series", "plot_command", "plot_metrics", "register"]

Series = dict[str, dict[str, tuple[list[float], list[float]]]]
"""metric name -> run label -> (x values, y values)."""


def find_metric_files(run_dir: str | Path) -> list[Path]:
    """Return the ``metrics.jsonl`` files to plot: ``run_dir`` itself if it is one, the file in
    it, or every one below it (sorted).
    """
    path = Path(run_dir)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(
            f"{str(path)!r} does not exist; pass the folder given as "
            "Accelerator(project_dir=...) or a metrics.jsonl file."
        )
    direct = path / METRICS_FILE
    if direct.is_file():
        return [direct]
    found = sorted(path.rglob(METRICS_FILE))
    if not found:
        raise FileNotFoundError(
            f"no {METRICS_FILE} under {str(path)!r}. Log with "
            "Accelerator(log_with='jsonl', project_dir=...) and call init_trackers() first."
        )
    return found


def _label(file: Path, root: Path) -> str:
    parent = file.parent
    if root.is_file() or parent == root:
        return parent.name or str(parent)
    return str(parent.relative_to(root))


def load_series(files: list[Path], root: str | Path | None = None) -> Series:
    """Collect each numeric metric's (step, value) points per run from ``files``.

    A record logged without a step is placed at its line index.
    """
    base = Path(root) if root is not None else files[0].parent
    series: Series = defaultdict(dict)
    for file in files:
        label = _label(file, base)
        for index, record in enumerate(read_metrics(file)):
            step = record.get("step")
            x = float(step) if isinstance(step, int | float) else float(index)
            for name, value in record["values"].items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                xs, ys = series[name].setdefault(label, ([], []))
                xs.append(x)
                ys.append(float(value))
    return dict(series)


def plot_metrics(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Draw every metric found under ``run_dir`` into a PNG; return its path.

    ``output`` defaults to ``<run_dir>/metrics.png`` (beside the file when given a file).
    """
    files = find_metric_files(run_dir)
    series = load_series(files, run_dir)
    if not series:
        raise ValueError(
            f"{[str(f) for f in files]} hold no numeric metrics; log numbers "
            "with accelerator.log({'loss': loss.item()}, step=step)."
        )
    root = Path(run_dir)
    target = (
        Path(output)
        if output is not None
        else (root.parent if root.is_file() else root) / "metrics.png"
    )
    runs = sorted({label for per_run in series.values() for label in per_run})
    figure = _draw(series, title=runs[0] if len(runs) == 1 else str(root))
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    return target


def _draw(series: Series, title: str) -> Any:
    require("matplotlib", feature="hasten plot", extra="plot")  # optional: matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional: matplotlib
    from matplotlib.figure import Figure  # optional: matplotlib

    names = sorted(series)
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    figure = Figure(figsize=(5.0 * cols, 3.4 * rows), layout="constrained")
    FigureCanvasAgg(figure)  # off-screen rendering: no display, no pyplot global state
    axes = figure.subplots(rows, cols, squeeze=False)
    several_runs = any(len(runs) > 1 for runs in series.values())
    for ax, name in zip(axes.flat, names, strict=False):
        for label, (xs, ys) in sorted(series[name].items()):
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if several_runs:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    figure.suptitle(title)
    return figure


def plot_command(args: argparse.Namespace) -> int:
    """Entry point of ``hasten plot``."""
    target = plot_metrics(args.run_dir, args.output)
    print(f"hasten plot: wrote {target}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``hasten plot`` to the ``hasten`` command table."""
    parser = subparsers.add_parser(
        "plot",
        help="Draw the metrics logged by the built-in 'jsonl' tracker (needs matplotlib).",
        description=(
            "Plot every numeric metric in the metrics.jsonl file(s) at or under RUN_DIR, one "
            "panel per metric against the step."
        ),
    )
    parser.add_argument(
        "run_dir", help="project_dir / logging_dir, a run folder or a metrics.jsonl file"
    )
    parser.add_argument(
        "-o", "--output", default=None, help="PNG file to write (default: RUN_DIR/metrics.png)"
    )
    parser.set_defaults(func=plot_command)

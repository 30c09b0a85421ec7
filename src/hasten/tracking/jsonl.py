"""The built-in tracker: one JSON line per `log` call, no extra dependency.

Writes ``<logging_dir>/<project>/metrics.jsonl`` (appending, so a resumed run continues the same
file) with lines like ``{"step": 3, "time": 1732900000.12, "values": {"loss": 0.41}}``, and
``config.json`` beside it. Each line is flushed as it is written, so a crash loses at most the
line being written; ``fsync=True`` also survives a machine crash, at a cost per call.
``hasten plot`` reads the file back.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner, flatten_dict, to_scalar

__all__ = ["CONFIG_FILE", "JSONLTracker", "METRICS_FILE", "read_metrics"]

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


class JSONLTracker(GeneralTracker):
    """Append metrics to ``<logging_dir>/<run_name>/metrics.jsonl``; select with ``log_with="jsonl"``.

    Args:
        run_name: the project name; the run's folder under ``logging_dir``.
        logging_dir: parent folder (the Accelerator's ``logging_dir``).
        fsync: also ``os.fsync`` after every line, for runs that must survive power loss.
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike[str], fsync: bool = False
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self.run_dir = Path(logging_dir) / run_name
        self.path = self.run_dir / METRICS_FILE
        self.fsync = fsync
        self._file: IO[str] | None = None
        self._skips = SkipWarner(self.name)

    def start(self) -> None:
        """Create the run folder and open ``metrics.jsonl`` for appending."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        if self._file.tell() > 0 and not _ends_with_newline(self.path):
            self._file.write("\n")  # a previous run died mid-line: keep its cut line apart

    @property
    def tracker(self) -> IO[str] | None:
        """The open ``metrics.jsonl`` file (None before start and after finish)."""
        return self._file

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Write ``values`` to ``config.json`` beside the metrics (atomically replaced)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / f".{CONFIG_FILE}.tmp"
        tmp.write_text(json.dumps(values, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.run_dir / CONFIG_FILE)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Append one line with ``step``, the wall time and the scalar/string ``values``.

        Nested dicts are flattened to ``"outer/inner"`` keys; other non-scalar values are skipped
        with one warning per key.
        """
        if self._file is None:
            raise RuntimeError(
                f"JSONLTracker({self.run_name!r}) is not open: call start() (init_trackers) "
                "before log(), and do not log after finish() (end_training)."
            )
        line = json.dumps({"step": step, "time": time.time(), "values": self._clean(values)})
        self._file.write(line + "\n")
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def _clean(self, values: Mapping[str, Any]) -> dict[str, Any]:
        clean: dict[str, Any] = {}
        for key, value in values.items():
            kind = type(value)
            if kind is float or kind is int or kind is str:  # the common case, checked cheaply
                clean[key] = value
                continue
            scalar = to_scalar(value)
            if scalar is not None:
                clean[key] = scalar
            elif isinstance(value, str):
                clean[key] = value
            elif isinstance(value, Mapping):
                clean.update(self._clean(flatten_dict(value, prefix=str(key))))
            else:
                self._skips.skip(key, value, "numbers, strings or dicts of them")
        return clean

    def finish(self) -> None:
        """Close ``metrics.jsonl``."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` back as a list of ``{"step", "time", "values"}`` records.

    Lines that are not records (a line cut short by a crash) are skipped with one warning
    naming the file and the line numbers.
    """
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("values"), dict):
            records.append(record)
        else:
            bad.append(number)
    if bad:
        warnings.warn(
            f"{path}: skipped {len(bad)} line(s) that are not metrics records (lines "
            f"{bad[:5]}{'...' if len(bad) > 5 else ''}); a line cut short by a crash looks so.",
            UserWarning,
            stacklevel=2,
        )
    return records

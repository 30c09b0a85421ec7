"""pytest plugin for ``make conformance``: one JSON line per test (id, outcome, first line of why).

Loaded with ``-p hasten_conformance.plugin``; writes to ``HASTEN_CONFORMANCE_RESULTS``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

__all__ = ["pytest_collectreport", "pytest_runtest_logreport", "pytest_sessionfinish"]

_outcomes: dict[str, dict[str, str]] = {}


def _why(report: Any) -> str:
    """The skip reason, or the first ``E`` line of a failure (the exception pytest shows)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:300]
    lines = (getattr(report, "longreprtext", "") or "").strip().splitlines()
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    errors = [e for e in errors if e and not e.startswith("+")]
    if not errors:
        return (lines[-1] if lines else "")[:300]
    # A worker's traceback ends with the real error; the first line names the wrapper.
    first, last = errors[0], errors[-1]
    return (first if first == last or len(errors) < 3 else f"{first[:120]} ... {last}")[:400]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "why": ""})
    if report.failed:
        if entry["outcome"] != "failed":
            entry.update(outcome="failed", why=f"{report.when}: {_why(report)}")
    elif report.skipped and entry["outcome"] == "passed":
        entry.update(outcome="skipped", why=_why(report))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _outcomes[report.nodeid] = {"outcome": "failed", "why": f"collection: {_why(report)}"}


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("HASTEN_CONFORMANCE_RESULTS")
    if not path:
        return
    with open(path, "w") as out:
        for nodeid, entry in _outcomes.items():
            out.write(json.dumps({"id": nodeid, **entry}) + "\n")

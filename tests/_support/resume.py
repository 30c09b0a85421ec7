"""Running ``tests/cli/resume_script.py`` and comparing its results with an uninterrupted run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = ["HASTEN", "SCRIPT", "assert_resumed_exactly", "launch", "results"]

SCRIPT = Path(__file__).resolve().parents[1] / "cli" / "resume_script.py"
HASTEN = Path(sys.executable).parent / "hasten"


def launch(
    out: Path, *argv: str, options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the script on 2 CPU processes through ``hasten launch``."""
    command = [str(HASTEN), "launch", "--cpu", "--num_processes", "2", *options]
    return subprocess.run(
        [*command, str(SCRIPT), str(out), *argv],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


def results(out: Path, phase: str, rank: int) -> dict[str, Any]:
    """What the script saved for ``phase`` on process ``rank``: its losses and final weights."""
    return torch.load(out / f"{phase}_{rank}.pt", weights_only=True)


def assert_resumed_exactly(
    reference: Path, out: Path, rank: int, first: str = "first", second: str = "second"
) -> None:
    """Losses of first + second equal the uninterrupted run's, bit for bit, and so do weights."""
    full = results(reference, "full", rank)
    before, after = results(out, first, rank), results(out, second, rank)
    assert before["losses"] + after["losses"] == full["losses"]
    for name, value in full["weights"].items():
        assert torch.equal(after["weights"][name], value), name

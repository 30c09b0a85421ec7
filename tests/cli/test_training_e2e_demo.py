"""`make demo`: the example classifier trains on 2 CPU processes through `hasten launch`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[2]
HASTEN = Path(sys.executable).parent / "hasten"


def test_demo_trains_and_reports_accuracy(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            str(HASTEN),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            str(ROOT / "examples" / "train_classifier.py"),
            "--epochs",
            "1",
            "--project_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    accuracies = [float(a) for a in re.findall(r"accuracy ([0-9.]+) on 1000 samples", proc.stdout)]
    assert len(accuracies) == 1  # printed once per epoch, by the main process only
    assert accuracies[-1] > 0.5  # four classes: chance is 0.25
    lines = (tmp_path / "train_classifier" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert any("eval/accuracy" in json.dumps(r) for r in records)
    assert any("train/loss" in json.dumps(r) for r in records)

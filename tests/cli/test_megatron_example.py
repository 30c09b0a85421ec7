"""Accelerate's Megatron-LM GPT example, ported by its import, runs under `hasten launch`.

Without Megatron (2 CPU processes, DDP) it trains, evaluates, checkpoints each epoch, logs and
saves the model. (With Megatron asked for on a machine without CUDA, prepare() stops saying
Megatron-LM needs CUDA GPUs: tests/unit/strategies/test_megatron.py.)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.core.imports import is_transformers_available

pytestmark = [
    pytest.mark.cli,
    pytest.mark.skipif(not is_transformers_available(), reason="transformers is not installed"),
]

SCRIPT = (
    Path(__file__).resolve().parents[2]
    / "examples"
    / "by_feature"
    / "megatron_lm_gpt_pretraining.py"
)


def _launch(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "MEGATRON_"))}
    clean.update(HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "hasten.commands.cli", "launch", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=clean,
        cwd=str(tmp_path),
    )


def test_example_trains_without_megatron(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _launch(
        "--cpu", "--num_processes", "2", str(SCRIPT), "--output_dir", str(out),
        "--checkpointing_steps", "epoch", "--with_tracking", "--report_to", "jsonl", "--seed", "0",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_loss"] < math.log(256)  # learnt something beyond a uniform guess
    assert (out / "epoch_0").is_dir() and (out / "epoch_1").is_dir()
    assert (out / "model.safetensors").is_file()
    assert "Total train batch size = 16" in result.stdout + result.stderr

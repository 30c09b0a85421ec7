"""Exact resume: 2N steps straight equal N steps + save_state + fresh processes + load_state + N.

Also preemption end to end: a SIGTERM mid-epoch checkpoints, the launcher restarts, the run
continues exactly.

`resume_script.py` trains with shuffling, dropout, gradient accumulation (saved mid-cycle), an
LR scheduler and fp16 with a GradScaler. One process runs in this process (state reset between
phases, a different seed for the resumed phase); two processes go through ``hasten launch``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from unittest.mock import patch

import pytest
import torch

from _support.resume import HASTEN, SCRIPT, assert_resumed_exactly, launch, results
from hasten.checkpointing.preemption import PREEMPTED_EXIT_CODE
from hasten.state._shared import reset_state

pytestmark = pytest.mark.cli


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("resume_script", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_process(out: Path, *argv: str) -> None:
    """Run one phase of the script here, as if in a fresh process."""
    module = _script()
    reset_state()
    try:
        with patch.object(sys, "argv", [str(SCRIPT), str(out), *argv]):
            assert module.main() == 0
    finally:
        reset_state()


@pytest.fixture(scope="module")
def single_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full_1")
    run_in_process(out, "full")
    return out


@pytest.mark.parametrize(
    ("save_at", "convention"),
    [(7, "skip"), (7, "direct"), (12, "skip"), (17, "direct")],
)
def test_one_process_resumes_bitwise(
    single_reference: Path, tmp_path: Path, save_at: int, convention: str
) -> None:
    # 12 batches per epoch, accumulation 3: 7 and 17 are mid-epoch and mid-cycle, 12 is the
    # epoch boundary; 17 resumes in the second epoch.
    run_in_process(tmp_path, "first", "--save-at", str(save_at))
    assert (tmp_path / "checkpoint" / "gradients_0_0.safetensors").is_file() == (save_at % 3 != 0)
    run_in_process(tmp_path, "second", "--convention", convention)
    assert len(results(single_reference, "full", 0)["losses"]) == 24
    assert_resumed_exactly(single_reference, tmp_path, 0)


def test_resume_without_the_saved_gradients_differs(single_reference: Path, tmp_path: Path) -> None:
    # The check above can fail: dropping the mid-cycle gradients changes the run.
    run_in_process(tmp_path, "first", "--save-at", "7")
    folder = tmp_path / "checkpoint"
    (folder / "gradients_0_0.safetensors").unlink()
    manifest = json.loads((folder / "hasten_manifest.json").read_text())
    manifest["files"] = [f for f in manifest["files"] if not f["name"].startswith("gradients")]
    (folder / "hasten_manifest.json").write_text(json.dumps(manifest))
    run_in_process(tmp_path, "second")
    full = results(single_reference, "full", 0)["losses"]
    resumed = results(tmp_path, "first", 0)["losses"] + results(tmp_path, "second", 0)["losses"]
    assert resumed[:8] == full[:8]
    assert resumed != full


@pytest.mark.timeout(400)
def test_two_processes_resume_bitwise(launched_reference: Path, tmp_path: Path) -> None:
    # 6 batches per process and epoch: step 4 is mid-epoch and mid-accumulation-cycle.
    proc = launch(tmp_path, "first", "--save-at", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {p.name for p in (tmp_path / "checkpoint").iterdir()}
    assert {"gradients_0_0.safetensors", "gradients_0_1.safetensors"} <= names
    assert {"random_states_0.pkl", "random_states_1.pkl", "scaler.pt"} <= names
    proc = launch(tmp_path, "second")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert len(results(launched_reference, "full", rank)["losses"]) == 12
        assert_resumed_exactly(launched_reference, tmp_path, rank)


def _wait_for_progress(out: Path, rank: int, steps: int, proc: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 120
    progress = out / f"progress_{rank}"
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.is_file() and progress.read_text().strip().isdigit():
            done = int(progress.read_text())
            if done >= steps:
                return done
        time.sleep(0.05)
    raise AssertionError(f"training never reached step {steps}: {proc.communicate()}")


@pytest.mark.timeout(300)
def test_preempted_job_checkpoints_restarts_and_continues_exactly(
    launched_reference: Path, tmp_path: Path
) -> None:
    # SIGTERM reaches one worker only, mid-epoch: both agree at the same step, save
    # checkpoint_0 together and exit with code 75; the launcher restarts them once and
    # load_state() resumes from the newest complete checkpoint (iterating the loader directly).
    command = [str(HASTEN), "launch", "--cpu", "--num_processes", "2", "--max_restarts", "1"]
    args = [str(SCRIPT), str(tmp_path), "preempt", "--convention", "direct"]
    with subprocess.Popen(
        [*command, *args, "--step-delay", "0.25"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        try:
            _wait_for_progress(tmp_path, 1, 3, proc)
            os.kill(int((tmp_path / "pid_1").read_text()), signal.SIGTERM)
            output, _ = proc.communicate(timeout=150)
        finally:
            proc.kill()
    assert proc.returncode == 0, output
    assert f"exiting with code {PREEMPTED_EXIT_CODE}" in output
    assert sorted(p.name for p in (tmp_path / "project" / "checkpoints").iterdir()) == [
        "checkpoint_0"
    ]
    for rank in (0, 1):
        before, after = results(tmp_path, "attempt0", rank), results(tmp_path, "attempt1", rank)
        assert 3 <= len(before["losses"]) < 12  # stopped mid-run, after the step it was in
        full = results(launched_reference, "full", rank)
        assert before["losses"] + after["losses"] == full["losses"]
        for name, value in full["weights"].items():
            assert torch.equal(after["weights"][name], value), name

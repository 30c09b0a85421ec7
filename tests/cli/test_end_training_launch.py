"""end_training() through ``hasten launch``: 2 processes, the group destroyed, a clean exit, 20 times.

Each launch runs a tiny script (a tracker, an async save, end_training) and must exit 0 with
no gloo abort or hang. The 20 launches run 4 at a time: the cost is importing torch in three
processes per launch, and running them side by side keeps the test near a minute on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support.distributed import free_port

pytestmark = [pytest.mark.cli, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LAUNCHES = 20
AT_ONCE = 4

SCRIPT = """\
import sys
import torch.distributed as dist
from hasten import Accelerator

folder = sys.argv[1]
acc = Accelerator(cpu=True, log_with="jsonl", project_dir=folder)
acc.init_trackers("run")
acc.log({"loss": 1.0}, step=0)
acc.save_state(f"{folder}/ckpt", async_save=True)
acc.end_training()
assert not dist.is_initialized(), "end_training() left the process group alive"
print(f"clean exit {acc.process_index}", flush=True)
"""

# What a torn-down-too-early or never-destroyed gloo group prints on the way out.
BAD_SIGNS = ("terminate called", "Aborted", "core dumped", "Connection reset", "Traceback")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def _launch(script: Path, folder: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "hasten.commands.cli", "launch", "--cpu"]
    command += ["--num_processes", "2", "--main_process_port", str(free_port())]
    return subprocess.Popen(
        [*command, str(script), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(REPO),
    )


@pytest.mark.timeout(600)
def test_end_training_exits_cleanly_twenty_launches_in_a_row(tmp_path: Path) -> None:
    script = tmp_path / "tiny.py"
    script.write_text(SCRIPT)
    env = _env(tmp_path)
    started = time.monotonic()
    failures: list[str] = []
    for first in range(0, LAUNCHES, AT_ONCE):
        batch = [
            (i, _launch(script, tmp_path / f"run{i}", env))
            for i in range(first, min(first + AT_ONCE, LAUNCHES))
        ]
        for i, proc in batch:
            try:
                out, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                failures.append(f"launch {i} hung (killed after 120 s):\n{out}")
                continue
            bad = [sign for sign in BAD_SIGNS if sign in out]
            clean = "clean exit 0" in out and "clean exit 1" in out
            if proc.returncode != 0 or bad or not clean:
                failures.append(f"launch {i}: exit {proc.returncode}, signs {bad}:\n{out}")
            elif not (tmp_path / f"run{i}" / "ckpt").is_dir():
                failures.append(f"launch {i}: the async save did not complete before exit")
    elapsed = time.monotonic() - started
    print(f"{LAUNCHES} launches ({AT_ONCE} at a time) took {elapsed:.1f} s")
    assert not failures, "\n\n".join(failures[:3])

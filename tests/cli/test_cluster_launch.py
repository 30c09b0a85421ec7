"""Where clusters start the processes: the torchrun contract, two machines, an elastic restart.

Each case trains `resume_script.py` (shuffling, dropout, accumulation, fp16 with a scaler) on 2
CPU processes on loopback, saves, and resumes in new processes; the losses and weights must
equal an uninterrupted ``hasten launch`` run bit for bit.

- Kubernetes (PyTorchJob / TrainJob) and any torchrun-contract launcher: processes started with
  only RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. They exit
  without ``end_training()``: the group hasten made is torn down at exit, with no signal.
- ``hasten launch`` run once per machine (``--num_machines 2 --machine_rank 0/1``), each machine
  with its own working and checkpoint folder (no shared storage: ``save_on_each_node``).
- ``hasten launch --max_restarts 1``: a worker killed mid-run; the group restarts and
  ``load_state()`` continues from the newest complete checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _support.distributed import free_port
from _support.resume import HASTEN, SCRIPT, assert_resumed_exactly, results

pytestmark = pytest.mark.cli

# What a gloo group torn down badly at exit prints on the way out.
BAD_SIGNS = ("terminate called", "Aborted", "core dumped")


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """This environment without any launcher's or Accelerate's variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "SLURM_", "TORCHELASTIC_", "PMI_", "OMPI_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
        and k not in ("MASTER_ADDR", "MASTER_PORT", "HASTEN_RESTART_COUNT")
    }
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def _torchrun_contract(out: Path, *argv: str) -> list[subprocess.CompletedProcess[str]]:
    """Start the script as two plain processes with only torchrun's six variables."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = _clean_env(out) | {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        command = [sys.executable, str(SCRIPT), str(out), *argv]
        procs.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    done = []
    for proc in procs:
        output, _ = proc.communicate(timeout=150)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, output, ""))
    return done


def _assert_clean(procs: list[subprocess.CompletedProcess[str]]) -> None:
    for proc in procs:
        assert proc.returncode == 0, proc.stdout
        assert not any(sign in proc.stdout for sign in BAD_SIGNS), proc.stdout


@pytest.mark.timeout(400)
def test_processes_started_with_only_torchruns_variables_train_save_and_resume(
    launched_reference: Path, tmp_path: Path
) -> None:
    # "first" returns without end_training(): the group is torn down at interpreter exit
    _assert_clean(_torchrun_contract(tmp_path, "first", "--save-at", "4"))
    _assert_clean(_torchrun_contract(tmp_path, "second"))
    for rank in (0, 1):
        assert_resumed_exactly(launched_reference, tmp_path, rank)


def _two_machines(folders: list[Path], port: int, *argv: str) -> list[str]:
    """``hasten launch`` once per simulated machine, each in its own folder, side by side."""
    procs = []
    for machine, folder in enumerate(folders):
        command = [str(HASTEN), "launch", "--cpu", "--num_processes", "2"]
        command += ["--num_machines", "2", "--machine_rank", str(machine)]
        command += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
        command += [str(SCRIPT), str(folder), *argv, "--save-on-each-node"]
        procs.append(
            subprocess.Popen(
                command,
                cwd=folder,
                env=_clean_env(folder),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    for proc in procs:
        output, _ = proc.communicate(timeout=200)
        assert proc.returncode == 0, output
        outputs.append(output)
    return outputs


@pytest.mark.clusters  # four processes per phase: `make test-clusters`
@pytest.mark.timeout(500)
def test_two_machines_with_their_own_folders_save_and_resume(
    launched_reference: Path, tmp_path: Path
) -> None:
    folders = [tmp_path / "machine0", tmp_path / "machine1"]
    for folder in folders:
        folder.mkdir()
    _two_machines(folders, free_port(), "first", "--save-at", "4")
    for folder in folders:  # each machine's folder holds a complete checkpoint of its own
        names = {p.name for p in (folder / "checkpoint").iterdir()}
        assert {"model.safetensors", "optimizer.bin", "scaler.pt"} <= names
    assert (folders[1] / "checkpoint" / "hasten_manifest_1.json").is_file()
    _two_machines(folders, free_port(), "second")
    for rank, folder in enumerate(folders):
        assert_resumed_exactly(launched_reference, folder, rank)


@pytest.mark.timeout(400)
def test_a_killed_worker_restarts_the_group_which_resumes_from_the_newest_checkpoint(
    launched_reference: Path, tmp_path: Path
) -> None:
    # saves every 3 steps (checkpoints after steps 3, 6, ...); process 1 is killed at step 5 of
    # the first attempt, so the restarted group resumes at step 3 and redoes steps 4 and 5
    command = [str(HASTEN), "launch", "--cpu", "--num_processes", "2", "--max_restarts", "1"]
    args = [str(SCRIPT), str(tmp_path), "elastic", "--save-at", "3", "--die-at", "5"]
    proc = subprocess.run(
        [*command, *args, "--convention", "direct"],
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "stopped by signal 9" in output and "restarting the workers (1 of 1" in output
    full = results(launched_reference, "full", 0)["losses"]
    assert results(tmp_path, "attempt0", 0)["losses"][:3] == full[:3]
    assert not (tmp_path / "attempt0_1.pt").exists()  # killed: no results
    for rank in (0, 1):
        after = results(tmp_path, "attempt1", rank)
        reference = results(launched_reference, "full", rank)
        assert after["losses"] == reference["losses"][3:]
        for name, value in reference["weights"].items():
            assert (after["weights"][name] == value).all(), name

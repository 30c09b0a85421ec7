"""Two simulated machines on loopback under ``hasten launch --nnodes 1:2``; one is killed."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# ~50 s on 2 cores: behind the clusters marker (make test-clusters); tests/unit/launchers/
# test_rendezvous.py covers the settings in the default suite.
pytestmark = [pytest.mark.cli, pytest.mark.distributed, pytest.mark.slow, pytest.mark.clusters]

SCRIPT = Path(__file__).resolve().parent / "elastic_script.py"
HASTEN = Path(sys.executable).parent / "hasten"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _machine(rank: int, port: int, out: Path, steps: int, pause: float) -> subprocess.Popen[str]:
    command = [
        str(HASTEN), "launch", "--cpu", "--nnodes", "1:2", "--num_processes", "2",
        "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
        "--main_process_port", str(port), "--max_restarts", "3", "--monitor_interval", "0.2",
        str(SCRIPT), str(out), str(steps), str(pause),
    ]  # fmt: skip
    log = (out / f"machine{rank}.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        found += [int(child), *_descendants(int(child))]
    return found


def _kill_machine(proc: subprocess.Popen[str]) -> None:
    """kill -9 the agent and its workers (torch starts workers in their own sessions)."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def _wait_for(path: Path, pattern: str, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, path.read_text())
        if match:
            return match
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} within {timeout} s in:\n{path.read_text()}")


@pytest.mark.timeout(150)
def test_survivor_continues_at_new_world_size_from_checkpoint(tmp_path: Path) -> None:
    port = _free_port()
    machines = [_machine(0, port, tmp_path, 40, 0.25)]
    time.sleep(0.5)  # machine 0 hosts the rendezvous store
    machines.append(_machine(1, port, tmp_path, 40, 0.25))
    try:
        log = tmp_path / "machine0.log"
        _wait_for(log, r"START world=2 resumed=0", 60)
        deadline = time.monotonic() + 60
        while not (tmp_path / "checkpoints" / "checkpoint_1").is_dir():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        killed_at = time.time()
        _kill_machine(machines[1])
        resumed = _wait_for(log, r"START world=1 resumed=(\d+)", 60)
        assert int(resumed.group(1)) >= 4  # the newest complete checkpoint, not step 0
        first = _wait_for(log, r"STEP world=1 t=([\d.]+)", 30)
        print(f"recovery: {float(first.group(1)) - killed_at:.1f} s")
        assert machines[0].wait(timeout=60) == 0, log.read_text()
        assert "DONE world=1 step=40" in log.read_text()
    finally:
        for proc in machines:
            if proc.poll() is None:
                _kill_machine(proc)


@pytest.mark.timeout(150)
def test_machine_joining_late_restarts_the_group_once(tmp_path: Path) -> None:
    port = _free_port()
    machines = [_machine(0, port, tmp_path, 150, 0.1)]
    try:
        log0, log1 = tmp_path / "machine0.log", tmp_path / "machine1.log"
        _wait_for(log0, r"STEP world=1", 60)  # the first round closed with machine 0 alone
        machines.append(_machine(1, port, tmp_path, 150, 0.1))
        assert machines[0].wait(timeout=120) == 0, log0.read_text()
        assert machines[1].wait(timeout=30) == 0, log1.read_text()
        starts0 = re.findall(r"START world=(\d+)", log0.read_text())
        starts1 = re.findall(r"START world=(\d+)", log1.read_text())
        assert starts0 == ["1", "2"], log0.read_text()  # one restart, at the larger world
        assert starts1 == ["2"], log1.read_text()  # never a group of its own
        assert "DONE world=2 step=150" in log0.read_text()
    finally:
        for proc in machines:
            if proc.poll() is None:
                _kill_machine(proc)

"""End-to-end ``hasten launch``: real subprocesses, real torch elastic, gloo on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from _support.distributed import free_port

pytestmark = pytest.mark.cli

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1", **extra)
    return env


def _hasten(
    *args: str, env: dict[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hasten.commands.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(REPO),
    )


def _start(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hasten.commands.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(REPO),
    )


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


@pytest.mark.timeout(120)
def test_two_cpu_processes_run_the_example(tmp_path: Path) -> None:
    out = _hasten(
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        "examples/hello_distributed.py",
        env=_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert "2 process(es), MULTI_CPU, backend=gloo" in out.stdout
    assert "total sum of squares 1..10 = 385" in out.stdout


@pytest.mark.timeout(60)
def test_worker_crash_stops_all_workers_quickly_with_its_traceback(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "crash.py",
        "import os, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise ValueError('boom from rank 1')\n"
        "time.sleep(60)\n",
    )
    start = time.monotonic()
    out = _hasten("launch", "--cpu", "--num_processes", "2", script, env=_env(tmp_path), timeout=45)
    elapsed = time.monotonic() - start
    assert out.returncode == 1
    assert elapsed < 20, f"launch took {elapsed:.1f}s to notice the crash"
    summary = out.stderr[out.stderr.index("hasten launch: a worker failed") :]
    assert "rank 1 (local rank 1" in summary and "exited with code 1" in summary
    assert "ValueError: boom from rank 1" in summary
    assert "stopped by signal" in summary  # rank 0 was ended, not left sleeping


@pytest.mark.timeout(90)
def test_max_restarts_restarts_the_group_and_exit_code_propagates(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "flaky.py",
        "import os, sys, pathlib\n"
        "attempt, rank = os.environ['TORCHELASTIC_RESTART_COUNT'], os.environ['RANK']\n"
        # One file per attempt and rank: two workers printing at once can interleave mid-line.
        f"pathlib.Path({str(tmp_path)!r}, f'attempt{{attempt}}_rank{{rank}}').touch()\n"
        "if rank == '1':\n"
        "    sys.exit(3)\n",
    )
    out = _hasten(
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        "--max_restarts",
        "1",
        "--monitor_interval",
        "0.05",
        script,
        env=_env(tmp_path),
        timeout=80,
    )
    assert out.returncode == 3, out.stderr
    assert (tmp_path / "attempt0_rank1").exists()
    assert (tmp_path / "attempt1_rank1").exists()


@pytest.mark.timeout(120)
def test_two_machines_on_loopback_via_c10d(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "who.py",
        "from hasten.state import PartialState\n"
        "s = PartialState()\n"
        "print(f'rank={s.process_index}/{s.num_processes} {s.distributed_type.value}', flush=True)\n"
        "s.wait_for_everyone()\n"
        "s.destroy_process_group()\n",
    )
    port = str(free_port())
    common = [
        "launch",
        "--cpu",
        "--num_machines",
        "2",
        "--num_processes",
        "2",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        port,
        "--rdzv_backend",
        "c10d",
    ]
    env = _env(tmp_path)
    procs = [_start(*common, "--machine_rank", str(rank), script, env=env) for rank in (0, 1)]
    outputs = [proc.communicate(timeout=100)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    joined = "".join(outputs)
    assert "rank=0/2 MULTI_CPU" in joined and "rank=1/2 MULTI_CPU" in joined


@pytest.mark.timeout(120)
def test_slurm_allocation_is_inferred(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "where.py",
        "import os\n"
        "print('seen', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['GROUP_RANK'], flush=True)\n",
    )
    port = str(free_port())
    procs = []
    for node in (0, 1):
        env = _env(
            tmp_path,
            SLURM_JOB_ID="4242",
            SLURM_PROCID=str(node),
            SLURM_NNODES="2",
            SLURM_NODEID=str(node),
            SLURM_JOB_NODELIST="127.0.0.1,localhost",
        )
        procs.append(
            _start(
                "launch",
                "--cpu",
                "--num_processes",
                "2",
                "--main_process_port",
                port,
                script,
                env=env,
            )
        )
    outputs = [proc.communicate(timeout=100)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert "seen 0 2 0" in outputs[0] and "seen 1 2 1" in outputs[1]


def test_precedence_flag_over_env_over_config_file(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "mp.py",
        "import os\nprint(os.environ['ACCELERATE_MIXED_PRECISION'], 'RANK' in os.environ)\n",
    )
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"distributed_type": "NO", "mixed_precision": "fp16"}))
    base = ["launch", "--config_file", str(config)]
    assert _hasten(*base, script, env=_env(tmp_path)).stdout.split() == ["fp16", "False"]
    env = _env(tmp_path, ACCELERATE_MIXED_PRECISION="bf16")
    assert _hasten(*base, script, env=env).stdout.split() == ["bf16", "False"]
    flagged = _hasten(*base, "--mixed_precision", "no", script, env=env)
    assert flagged.stdout.split() == ["no", "False"]
    # Without any source: the default.
    assert _hasten("launch", script, env=_env(tmp_path)).stdout.split() == ["no", "False"]


@pytest.mark.timeout(90)
def test_script_argument_beats_launch_flag(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "state.py",
        "from hasten.state import AcceleratorState\n"
        "from hasten.state._shared import reset_state\n"
        "flag = AcceleratorState(_from_accelerator=True).mixed_precision\n"
        "reset_state()\n"
        "written = AcceleratorState(mixed_precision='no', _from_accelerator=True).mixed_precision\n"
        "print(flag, written)\n",
    )
    out = _hasten("launch", "--cpu", "--mixed_precision", "bf16", script, env=_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bf16", "no"]


def test_module_no_python_and_exit_code_of_one_process(tmp_path: Path) -> None:
    (tmp_path / "jobpkg.py").write_text("import sys\nprint('module', sys.argv[1:])\nsys.exit(7)\n")
    env = _env(tmp_path, PYTHONPATH=str(tmp_path))
    out = _hasten("launch", "-m", "jobpkg", "--x", "1", env=env)
    assert out.returncode == 7
    assert "module ['--x', '1']" in out.stdout
    tool = _script(tmp_path, "tool.sh", '#!/bin/sh\necho tool "$@" $ACCELERATE_USE_CPU\n')
    os.chmod(tool, 0o755)
    out = _hasten("launch", "--cpu", "--no_python", tool, "a", env=_env(tmp_path))
    assert out.stdout.strip() == "tool a true"


def test_bad_config_key_is_a_one_line_error(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"distributed_type": "NO", "num_gpu": 2}))
    out = _hasten("launch", "--config_file", str(config), "x.py", env=_env(tmp_path))
    assert out.returncode == 2
    assert "Unknown key(s) ['num_gpu']" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.timeout(60)
def test_stopping_the_launcher_stops_its_workers(tmp_path: Path) -> None:
    import signal

    script = _script(
        tmp_path,
        "sleepy.py",
        "import os, time\nprint('started', os.getpid(), flush=True)\ntime.sleep(60)\n",
    )
    port = str(free_port())  # not the default 29500, which another launcher may hold
    proc = _start(
        "launch", "--cpu", "--num_processes", "2", "--main_process_port", port, script,
        env=_env(tmp_path),
    )  # fmt: skip
    assert proc.stdout is not None
    pids = []
    while len(pids) < 2:
        line = proc.stdout.readline()
        assert line, "launcher ended before its workers started"
        if line.startswith("started"):
            pids.append(int(line.split()[1]))
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=30)[0]
    assert proc.returncode == 128 + signal.SIGTERM
    assert "received SIGTERM; workers stopped" in rest
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

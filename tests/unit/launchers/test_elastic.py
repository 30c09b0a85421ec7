from __future__ import annotations

import socket
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hasten.launchers import elastic
from hasten.launchers.elastic import (
    format_failures,
    launch_config,
    run,
    script_command,
    worker_command,
)
from hasten.launchers.plan import LaunchPlan


def test_commands_for_script_module_and_executable() -> None:
    assert script_command(LaunchPlan("t.py", ("-x",))) == [sys.executable, "t.py", "-x"]
    assert script_command(LaunchPlan("pkg.mod", module=True)) == [sys.executable, "-m", "pkg.mod"]
    assert script_command(LaunchPlan("./run.sh", ("1",), no_python=True)) == ["./run.sh", "1"]
    exe, args = worker_command(LaunchPlan("pkg.mod", ("a",), module=True))
    assert exe == sys.executable
    assert args == ["-u", "-m", "hasten.launchers.bootstrap", "-m", "pkg.mod", "a"]
    assert worker_command(LaunchPlan("./run.sh", no_python=True)) == ("./run.sh", [])


def test_launch_config_static_and_c10d() -> None:
    plan = LaunchPlan(
        "t.py",
        num_processes=4,
        num_machines=2,
        machine_rank=1,
        main_process_ip="10.1.2.3",
        max_restarts=2,
        monitor_interval=0.5,
        rdzv_id="job",
    )
    config = launch_config(plan, port=1234)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 2)
    assert config.rdzv_endpoint == "10.1.2.3:1234"
    assert config.rdzv_backend == "static"
    assert config.rdzv_configs["rank"] == 1
    assert (config.max_restarts, config.monitor_interval, config.run_id) == (2, 0.5, "job")
    assert config.local_addr is None
    c10d = launch_config(LaunchPlan("t.py", num_processes=2, num_machines=2, rdzv_backend="c10d"))
    assert c10d.rdzv_configs["is_host"] is True
    assert c10d.local_addr == "127.0.0.1"  # all machines on loopback


def _failure(exitcode: int, timestamp: int, message: Any = None) -> Any:
    data = {"message": message} if message is not None else {}
    return SimpleNamespace(
        exitcode=exitcode,
        timestamp=timestamp,
        local_rank=0,
        pid=1,
        error_file_data=data,
        message="",
    )


def test_format_failures_puts_the_cause_first_and_returns_its_code() -> None:
    crashed = _failure(3, 100, {"message": "X", "extraInfo": {"py_callstack": "Traceback: boom"}})
    stopped = _failure(-15, 99)
    text, code = format_failures({0: stopped, 1: crashed})
    assert code == 3
    assert text.index("rank 1") < text.index("rank 0")
    assert "Traceback: boom" in text
    assert "stopped by signal 15" in text
    _, killed_code = format_failures({0: _failure(-9, 1)})
    assert killed_code == 128 + 9


def _busy_port() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock, sock.getsockname()[1]


def test_single_machine_moves_off_a_busy_port() -> None:
    sock, port = _busy_port()
    with sock:
        plan = LaunchPlan("t.py", num_processes=2, main_process_port=port)
        chosen = elastic.choose_port(plan)
        assert chosen != port
        assert elastic.choose_port(LaunchPlan("t.py", num_processes=2, main_process_port=0)) > 0


def test_main_machine_refuses_a_busy_port() -> None:
    sock, port = _busy_port()
    with sock:
        plan = LaunchPlan("t.py", num_processes=2, num_machines=2, main_process_port=port)
        with pytest.raises(RuntimeError, match="already in use"):
            elastic.choose_port(plan)


def test_single_process_runs_directly_and_propagates_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        "assert 'RANK' not in os.environ  # no rendezvous for one process\n"
        "sys.exit(int(os.environ['ACCELERATE_GRADIENT_ACCUMULATION_STEPS']) + int(sys.argv[1]))\n"
    )
    env = {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "5"}
    code = run(LaunchPlan(str(script), ("2",)), env, replace_process=False)
    assert code == 7


def test_one_fsdp_process_off_the_cpu_still_gets_a_process_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[LaunchPlan] = []
    monkeypatch.setattr(elastic, "run_workers", lambda plan, env: started.append(plan) or 0)
    fsdp = {"ACCELERATE_USE_FSDP": "true"}
    assert run(LaunchPlan("job.py"), fsdp, replace_process=False) == 0  # as Accelerate: torchrun
    assert len(started) == 1
    ran: list[list[str]] = []
    monkeypatch.setattr(
        elastic.subprocess,
        "run",
        lambda cmd, **kw: ran.append(cmd) or SimpleNamespace(returncode=0),
    )
    run(LaunchPlan("job.py", use_cpu=True), fsdp, replace_process=False)  # --cpu: run directly
    run(LaunchPlan("job.py"), {"ACCELERATE_USE_FSDP": "false"}, replace_process=False)
    assert len(started) == 1 and len(ran) == 2


@pytest.mark.parametrize(
    ("make_error", "code", "message"),
    [
        (
            lambda: __import__(
                "torch.distributed.elastic.multiprocessing.api", fromlist=["x"]
            ).SignalException("stop", sigval=__import__("signal").SIGINT),
            130,
            "received SIGINT",
        ),
        (
            lambda: __import__(
                "torch.distributed.elastic.rendezvous", fromlist=["x"]
            ).RendezvousTimeoutError("nobody came"),
            1,
            "rendezvous at 127.0.0.1:",
        ),
    ],
)
def test_launcher_stops_and_rendezvous_failures_are_exit_codes(
    make_error: Any,
    code: int,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch.distributed.launcher.api as api

    def fake_launch(config: Any, entrypoint: Any) -> Any:
        def call(*args: Any) -> None:
            raise make_error()

        return call

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    monkeypatch.setattr(elastic, "apply_worker_env", lambda env: None)
    assert run(LaunchPlan("t.py", num_processes=2, main_process_port=0), {}) == code
    assert message in capsys.readouterr().err

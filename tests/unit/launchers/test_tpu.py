"""TPU launches and ``hasten tpu-config``: the XLA variables and the gcloud commands (never run)."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from hasten.commands import launch as launch_cmd
from hasten.commands import tpu as tpu_cmd
from hasten.commands.cli import main
from hasten.launchers import xla
from hasten.launchers.xla_pod import gcloud_ssh_command, pod_launch_command


@pytest.mark.parametrize(
    ("downcast", "variable"), [(False, "XLA_USE_BF16"), (True, "XLA_DOWNCAST_BF16")]
)
def test_prepare_tpu_sets_bf16_on_a_tpu(
    downcast: bool, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xla, "is_torch_xla_available", lambda check_is_tpu=False: check_is_tpu)
    args = argparse.Namespace(mixed_precision="bf16", downcast_bf16=downcast, debug=True)
    _, env = xla.prepare_tpu(args, {})
    assert env == {variable: "1", "ACCELERATE_DEBUG_MODE": "true"}
    monkeypatch.setattr(xla, "is_torch_xla_available", lambda check_is_tpu=False: False)
    assert xla.prepare_tpu(args, {})[1] == {"ACCELERATE_DEBUG_MODE": "true"}  # not a TPU


def test_prepare_tpu_for_a_pod_aliases_the_pod_arguments() -> None:
    args = argparse.Namespace(tpu_vm=["w0"], tpu_name="pod", mixed_precision="no")
    args, env = xla.prepare_tpu(args, {}, pod=True)
    assert (args.vm, args.tpu, env) == (["w0"], "pod", {})


def test_gcloud_command_is_accelerates() -> None:
    assert gcloud_ssh_command("pod", "zone-a", "ls", use_alpha=True) == [
        "gcloud", "alpha", "compute", "tpus", "tpu-vm", "ssh", "pod",
        "--zone", "zone-a", "--command", "ls", "--worker", "all",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="needs the TPU's name and zone"):
        gcloud_ssh_command("", "zone-a", "ls")


def test_launch_on_a_pod_runs_hasten_launch_on_every_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    ran: list[list[str]] = []
    monkeypatch.setattr(launch_cmd.subprocess, "run", lambda cmd, check: ran.append(cmd))
    code = main(
        ["launch", "--tpu", "--tpu_cluster", "--tpu_name", "pod", "--tpu_zone", "z",
         "--num_processes", "8", "--tpu_use_sudo", "--env", "A=1", "train.py", "--lr", "1"]
    )  # fmt: skip
    assert code == 0 and len(ran) == 1
    command = ran[0]
    assert command[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--zone"]
    assert command[-2:] == ["--worker", "all"]
    remote = command[command.index("--command") + 1]
    assert remote.startswith(f"cd {tmp_path}; sudo env ACCELERATE_IN_TPU_POD=1 A=1 ")
    assert remote.endswith(
        "hasten launch --tpu --no_tpu_cluster --num_machines 1 --mixed_precision no "
        "--dynamo_backend no --num_processes 8 --main_training_function main train.py --lr 1"
    )
    chosen = argparse.Namespace(training_script="t.py", tpu_name="p", tpu_zone="z", tpu_vm=["w1"])
    assert pod_launch_command(chosen, {})[-2:] == ["--worker", "w1"]


def test_tpu_launcher_spawns_the_main_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "tpu_script.py"
    script.write_text(
        "import os, sys\nCALLS = []\n"
        "def train():\n    CALLS.append((sys.argv[1:], os.environ.get('ACCELERATE_DEBUG_MODE')))\n"
    )
    spawned: list[Any] = []

    def spawn(fn: Any, args: tuple[Any, ...], nprocs: int | None) -> None:
        spawned.append(nprocs)
        fn(0, *args)

    fake = types.ModuleType("torch_xla.distributed.xla_multiprocessing")
    fake.spawn = spawn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_xla.distributed.xla_multiprocessing", fake)
    monkeypatch.setattr(xla, "require", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    args = launch_cmd.launch_command_parser().parse_args(
        ["--tpu", "--debug", "--main_training_function", "train", str(script), "--x"]
    )
    launch_cmd.tpu_launcher(args)
    assert spawned == [None]  # PJRT: one process per TPU device
    assert sys.modules["tpu_script"].CALLS == [(["--x"], "true")]
    args.main_training_function = "missing"
    with pytest.raises(ValueError, match="has no function 'missing'"):
        launch_cmd.tpu_launcher(args)
    args.no_python = True
    with pytest.raises(ValueError, match="--no_python cannot be used with --tpu"):
        launch_cmd.tpu_launcher(args)


def test_tpu_launcher_without_torch_xla_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(xla, "load_training_function", lambda *a, **k: print)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    args = launch_cmd.launch_command_parser().parse_args(["--tpu", "t.py"])
    with pytest.raises(ImportError, match="torch_xla"):
        launch_cmd.tpu_launcher(args)


def _tpu_config(*argv: str) -> argparse.Namespace:
    return tpu_cmd.tpu_command_parser().parse_args(list(argv))


def test_tpu_config_takes_pod_and_commands_from_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {"distributed_type": "XLA", "tpu_name": "pod", "tpu_zone": "z",
             "commands": ["pip install x", "echo done"]}
        )
    )  # fmt: skip
    assert tpu_cmd.tpu_command_launcher(_tpu_config("--config_file", str(config), "--debug")) == 0
    assert capsys.readouterr().out.strip() == (
        "Running gcloud compute tpus tpu-vm ssh pod --zone z --command "
        "cd /usr/share; pip install x; echo done --worker all"
    )
    lines = tmp_path / "cmds.txt"
    lines.write_text("echo 1\n\necho 2\n")
    args = _tpu_config(
        "--config_file", str(config), "--command_file", str(lines), "--tpu_name", "other",
        "--install_accelerate", "--accelerate_version", "0.3.0", "--use_alpha", "--debug",
    )  # fmt: skip
    tpu_cmd.tpu_command_launcher(args)
    out = capsys.readouterr().out
    assert "gcloud alpha compute tpus tpu-vm ssh other --zone z" in out
    assert "cd /usr/share; pip install hasten==0.3.0; echo 1; echo 2" in out


def test_tpu_config_runs_gcloud_without_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(tpu_cmd.subprocess, "run", lambda cmd, check: ran.append(cmd))
    args = _tpu_config("--tpu_name", "p", "--tpu_zone", "z", "--command", "ls", "/tmp")
    assert tpu_cmd.tpu_command_launcher(args) == 0
    assert ran == [gcloud_ssh_command("p", "z", "cd /usr/share; ls; /tmp")]


def test_tpu_config_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="No command to run on the pod"):
        tpu_cmd.tpu_command_launcher(_tpu_config("--tpu_name", "p", "--tpu_zone", "z"))
    with pytest.raises(ValueError, match="no public development branch"):
        tpu_cmd.tpu_command_launcher(
            _tpu_config("--tpu_name", "p", "--tpu_zone", "z", "--command", "ls",
                        "--install_accelerate", "--accelerate_version", "dev")
        )  # fmt: skip
    with pytest.raises(ValueError, match="needs the TPU's name and zone"):
        tpu_cmd.tpu_command_launcher(_tpu_config("--command", "ls"))
    assert main(["tpu-config", "--command", "ls"]) == 2  # one-line error through the CLI


def test_an_xla_config_file_routes_launch_to_the_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "tpu.yaml"
    config.write_text(
        yaml.safe_dump(
            {"distributed_type": "XLA", "tpu_use_cluster": True, "tpu_name": "cfg-pod",
             "tpu_zone": "cfg-zone", "main_training_function": "train", "num_processes": 8}
        )
    )  # fmt: skip
    ran: list[list[str]] = []
    monkeypatch.setattr(launch_cmd.subprocess, "run", lambda cmd, check: ran.append(cmd))
    assert main(["launch", "--config_file", str(config), "t.py"]) == 0
    assert ran[0][5:8] == ["cfg-pod", "--zone", "cfg-zone"]
    assert "--main_training_function train t.py" in ran[0][ran[0].index("--command") + 1]

"""Accelerate's launch helpers: what `hasten launch` runs, its help, and the dashed flags."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hasten.commands import launch
from hasten.commands.launch import (
    CustomHelpFormatter,
    clean_option,
    launch_command_parser,
    multi_gpu_launcher,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
    simple_launcher,
)
from hasten.commands.utils import CustomArgumentParser
from hasten.launchers import elastic


def _parse(*argv: str) -> argparse.Namespace:
    return launch_command_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("option", "cleaned"),
    [
        ("--num-processes=2", "--num_processes"),
        ("--mixed_precision", "--mixed_precision"),
        ("--use-fsdp", "--use_fsdp"),
        ("-m", "-m"),
        ("script.py", "script.py"),
    ],
)
def test_clean_option(option: str, cleaned: str) -> None:
    assert clean_option(option) == cleaned


def test_dashed_and_underscored_flags_parse_alike() -> None:
    dashed = _parse("--num-processes", "3", "--mixed-precision", "fp16", "--cpu", "t.py", "--a-b")
    plain = _parse("--num_processes", "3", "--mixed_precision", "fp16", "--cpu", "t.py", "--a-b")
    assert vars(dashed) == vars(plain)
    assert dashed.training_script_args == ["--a-b"]  # script arguments are left alone


def test_custom_argument_parser_groups_take_both_spellings() -> None:
    parser = CustomArgumentParser("x")
    group = parser.add_argument_group("G")
    group.add_argument("--max_restarts", type=int)
    parser.add_argument("--use_cpu", action="store_true")
    assert vars(parser.parse_args(["--max-restarts", "2", "--use-cpu"])) == {
        "max_restarts": 2,
        "use_cpu": True,
    }


def _help(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys, "argv", ["hasten", *argv])
    return launch_command_parser().format_help()


def test_help_lists_each_flag_once_and_tpu_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    sudo = "Run the pod command with sudo."
    full = _help(["--help"], monkeypatch)
    assert "--num_processes" in full and full.count("--num-processes") == 1  # only the note
    assert sudo in full  # --help alone lists every section
    narrowed = _help(["--cpu", "--help"], monkeypatch)
    assert "Total processes over all machines." in narrowed and sudo not in narrowed
    assert "AWS key id" not in narrowed and "TPU:" not in narrowed
    assert sudo in _help(["--tpu", "--help"], monkeypatch)
    assert isinstance(launch_command_parser()._get_formatter(), CustomHelpFormatter)


def test_simple_launcher_cmd_env_is_what_launch_execs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    seen: dict[str, Any] = {}

    def fake_exec(path: str, command: list[str], env: dict[str, str]) -> None:
        seen.update(command=command, env=env)

    monkeypatch.setattr(elastic.os, "execvpe", fake_exec)
    args = _parse("--cpu", "--mixed_precision", "bf16", "--env", "K=v", "t.py", "--lr", "1")
    launch._launch_from_cli(args)  # what `hasten launch` does
    command, env = prepare_simple_launcher_cmd_env(args)
    assert command == seen["command"] == [sys.executable, "t.py", "--lr", "1"]
    assert env == seen["env"]
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["K"] == "v"
    assert env["ACCELERATE_USE_CPU"] == "true"


def test_prepare_helpers_fill_a_hand_made_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(training_script="t.py", num_processes=2, use_cpu=True)
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_NUM_PROCESSES"] == "2"
    assert env["OMP_NUM_THREADS"]  # cores shared between the two workers
    command, _ = prepare_simple_launcher_cmd_env(args)
    assert command == [sys.executable, "t.py"]


def test_prepare_multi_gpu_env_takes_accelerate_style_namespaces() -> None:
    # Accelerate's helpers take a namespace with every flag spelled out (False/0 when unused),
    # no training script, and record the chosen port in args.master_port (0: a free one).
    args = argparse.Namespace(
        num_processes=1,
        main_process_port=0,
        use_fsdp=False,
        fsdp_reshard_after_forward=False,
        fsdp_min_num_params=0,
        use_deepspeed=False,
        zero_stage=None,
    )
    env = prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"
    assert "ACCELERATE_USE_FSDP" not in env and "FSDP_MIN_NUM_PARAMS" not in env
    assert "ACCELERATE_USE_DEEPSPEED" not in env


def test_launch_command_called_from_python_runs_a_child_and_raises_on_failure(
    tmp_path: Path,
) -> None:
    # Accelerate's tests call launch_command in their own process: it must come back.
    script = tmp_path / "s.py"
    script.write_text(
        "import sys\nopen(sys.argv[1], 'w').write('ran')\nsys.exit(int(sys.argv[2]))\n"
    )
    marker = tmp_path / "ran.txt"
    assert launch.launch_command(_parse("--cpu", str(script), str(marker), "0")) == 0
    assert marker.read_text() == "ran"
    with pytest.raises(subprocess.CalledProcessError) as info:
        launch.launch_command(_parse("--cpu", str(script), str(marker), "4"))
    assert info.value.returncode == 4


def test_simple_launcher_runs_once_and_raises_on_failure(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        "import os, sys\nopen(sys.argv[1], 'w').write(os.environ['ACCELERATE_MIXED_PRECISION'])\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    marker = tmp_path / "ran.txt"
    simple_launcher(_parse("--cpu", "--mixed_precision", "fp16", str(script), str(marker), "0"))
    assert marker.read_text() == "fp16"
    with pytest.raises(subprocess.CalledProcessError) as info:
        simple_launcher(_parse("--cpu", str(script), str(marker), "3"))
    assert info.value.returncode == 3


def test_multi_gpu_launcher_uses_the_elastic_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_workers(plan: Any, env: dict[str, str]) -> int:
        seen.update(plan=plan, env=env)
        return int(plan.script_args[0])

    monkeypatch.setattr(launch, "run_workers", fake_workers)
    multi_gpu_launcher(_parse("--cpu", "--num_processes", "1", "t.py", "0"))
    assert seen["plan"].num_processes == 1  # even one process goes through the agent
    assert seen["env"]["ACCELERATE_USE_CPU"] == "true"
    with pytest.raises(subprocess.CalledProcessError, match="exit status 4"):
        multi_gpu_launcher(_parse("--cpu", "--num_processes", "2", "t.py", "4"))


def test_validate_launch_command_fills_flags_not_given_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\ndebug: true\n"
        "num_processes: 1\nmixed_precision: bf16\nuse_cpu: true\n"
        "fsdp_config:\n  fsdp_sync_module_states: false\n"
        "deepspeed_config:\n  deepspeed_config_file: ignored.json\n"
    )
    args = _parse("--num-processes", "2", "--config-file", str(config), "t.py")
    same, loaded, mixed_precision_from_config = launch._validate_launch_command(args)
    assert same is args and loaded is not None and mixed_precision_from_config
    assert args.num_processes == 2  # the flag wins
    assert args.debug is True and args.use_cpu is True and args.mixed_precision == "bf16"
    assert args.fsdp_sync_module_states is False and args.use_fsdp is True
    # deepspeed_config belongs to another engine: not taken (an --zero_* flag turns DeepSpeed on)
    assert args.deepspeed_config_file is None


def test_validate_launch_command_without_a_config_leaves_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = argparse.Namespace(training_script="t.py", config_file=str(tmp_path / "none.yaml"))
    with pytest.raises(FileNotFoundError):
        launch._validate_launch_command(args)
    monkeypatch.setattr(launch, "load_launch_config", lambda path: None)
    args = _parse("--num-processes", "2", "t.py")
    before = dict(vars(args))
    assert launch._validate_launch_command(args) == (args, None, False)
    assert vars(args) == before


def test_help_spells_each_flag_with_underscores_and_says_dashes_work() -> None:
    # Accelerate's test_duplicate_entities: only the note names a dashed flag
    parser = launch_command_parser()
    text = parser.format_help()
    assert text.count("--num-processes") == 1
    for name in vars(parser.parse_args(["t.py"])):
        if "_" in name and name != "num_processes":
            assert f"--{name.replace('_', '-')}" not in text

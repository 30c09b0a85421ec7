from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hasten.commands import launch
from hasten.commands.launch import PRECEDENCE, launch_command_parser, plan_from_args
from hasten.launchers.plan import LaunchPlan


@pytest.fixture(autouse=True)
def _no_default_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in (
        "ACCELERATE_MIXED_PRECISION",
        "ACCELERATE_USE_CPU",
        "SLURM_JOB_ID",
        "SLURM_PROCID",
    ):
        monkeypatch.delenv(name, raising=False)


def _parse(*argv: str) -> Any:
    return launch_command_parser().parse_args(list(argv))


def test_every_documented_flag_parses() -> None:
    args = _parse(
        "--config_file",
        "c.yaml",
        "--cpu",
        "--multi_gpu",
        "--num_processes",
        "4",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--main_process_ip",
        "10.0.0.1",
        "--main_process_port",
        "1234",
        "--rdzv_backend",
        "c10d",
        "--same_network",
        "--mixed_precision",
        "BF16",
        "--gradient_accumulation_steps",
        "2",
        "--dynamo_backend",
        "INDUCTOR",
        "--max_restarts",
        "3",
        "--monitor_interval",
        "0.5",
        "--num_cpu_threads_per_process",
        "2",
        "--debug",
        "-m",
        "--env",
        "A=1",
        "--env",
        "B=x=y",
        "pkg.train",
        "--lr",
        "0.1",
        "--cpu",
    )
    assert args.use_cpu and args.multi_gpu and args.same_network and args.debug and args.module
    assert (args.num_processes, args.num_machines, args.machine_rank) == (4, 2, 1)
    assert (args.main_process_ip, args.main_process_port, args.rdzv_backend) == (
        "10.0.0.1",
        1234,
        "c10d",
    )
    assert (args.mixed_precision, args.dynamo_backend) == ("bf16", "inductor")
    assert (args.max_restarts, args.monitor_interval, args.num_cpu_threads_per_process) == (
        3,
        0.5,
        2,
    )
    assert args.env == [("A", "1"), ("B", "x=y")]
    # Everything after the script belongs to the script, even flags launch also knows.
    assert (args.training_script, args.training_script_args) == (
        "pkg.train",
        ["--lr", "0.1", "--cpu"],
    )


def test_unset_flags_are_none_so_lower_sources_apply() -> None:
    args = _parse("t.py")
    assert args.use_cpu is None and args.debug is None and args.mixed_precision is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "NOVALUE", "t.py"], "--env expects KEY=VALUE"),
        (["--mixed_precision", "fp32", "t.py"], "invalid choice: 'fp32'"),
        (["--rdzv_backend", "zeus", "t.py"], "invalid choice: 'zeus'"),
    ],
)
def test_bad_flags_are_reported(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse(*argv)
    assert message in capsys.readouterr().err


def test_help_documents_precedence() -> None:
    text = launch_command_parser().format_help()
    assert "flag of this command" in text and "environment variable" in text
    assert PRECEDENCE.splitlines()[0] in text


def test_precedence_flag_env_config_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "MULTI_CPU",
                "num_processes": 2,
                "mixed_precision": "fp16",
                "use_cpu": True,
                "debug": True,
            }
        )
    )
    plan, _ = plan_from_args(_parse("--config_file", str(config), "t.py"))
    assert (plan.mixed_precision, plan.sources["mixed_precision"]) == ("fp16", "config file")
    assert (
        plan.gradient_accumulation_steps == 1
        and plan.sources["gradient_accumulation_steps"] == "default"
    )
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    plan, _ = plan_from_args(_parse("--config_file", str(config), "t.py"))
    assert (plan.mixed_precision, plan.sources["mixed_precision"]) == (
        "bf16",
        "environment ACCELERATE_MIXED_PRECISION",
    )
    plan, _ = plan_from_args(
        _parse("--config_file", str(config), "--mixed_precision", "no", "t.py")
    )
    assert (plan.mixed_precision, plan.sources["mixed_precision"]) == (
        "no",
        "flag --mixed_precision",
    )
    assert plan.num_processes == 2 and plan.use_cpu and plan.debug


def test_default_config_file_is_used_when_present(tmp_path: Path) -> None:
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text(yaml.safe_dump({"distributed_type": "NO", "mixed_precision": "bf16"}))
    plan, config = plan_from_args(_parse("--cpu", "t.py"))
    assert plan.mixed_precision == "bf16"
    assert config is not None and config["mixed_precision"] == "bf16"


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plan_from_args(_parse("--config_file", str(tmp_path / "none.yaml"), "t.py"))


def test_slurm_allocation_sets_topology_and_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "SLURM_JOB_ID": "991",
        "SLURM_PROCID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "node[07-08]",
    }.items():
        monkeypatch.setenv(name, value)
    plan, _ = plan_from_args(_parse("--cpu", "--num_processes", "4", "t.py"))
    assert (plan.num_machines, plan.machine_rank, plan.main_process_ip) == (2, 1, "node07")
    assert plan.rdzv_id == "991"
    assert plan.nproc_per_node == 2


def test_launch_command_hands_plan_and_worker_env_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run(plan: LaunchPlan, env: dict[str, str], *, replace_process: bool = True) -> int:
        seen.update(plan=plan, env=env, replace=replace_process)
        return 4

    monkeypatch.setattr(launch, "run", fake_run)
    args = _parse("--cpu", "--num_processes", "2", "--env", "X=1", "--debug", "t.py", "a")
    assert launch.run_launch(args, replace_process=False) == 4
    assert seen["plan"].script_args == ("a",)
    assert seen["env"]["ACCELERATE_USE_CPU"] == "true"
    assert seen["env"]["ACCELERATE_DEBUG_MODE"] == "true"
    assert seen["env"]["X"] == "1"
    assert seen["replace"] is False


def test_device_count_skips_torch_without_device_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    def must_not_run() -> Any:
        raise AssertionError("current_platform() called although no device node exists")

    monkeypatch.setattr(launch.sys, "platform", "linux")
    monkeypatch.setattr(launch, "_DEVICE_NODES", ("/nonexistent/nvidia0",))
    monkeypatch.setattr("hasten.platforms.registry.current_platform", must_not_run)
    assert launch._count_devices() == 0
    fake = SimpleNamespace(name="cuda", device_count=lambda: 8)
    monkeypatch.setattr("hasten.platforms.registry.current_platform", lambda: fake)
    monkeypatch.setattr(launch, "_DEVICE_NODES", ("/",))
    assert launch._count_devices() == 8


def test_fp8_flags_reach_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(launch, "run", lambda plan, env, replace_process=True: seen.update(env=env))
    args = _parse(
        "--cpu", "--mixed_precision", "fp8", "--fp8_backend", "te", "--fp8_format", "e4m3",
        "--fp8_amax_history_len", "32", "--env", "ACCELERATE_FP8_MARGIN=2", "t.py",
    )  # fmt: skip
    launch.run_launch(args, replace_process=False)
    env = seen["env"]
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp8"
    assert env["ACCELERATE_FP8_BACKEND"] == "TE"
    assert env["ACCELERATE_FP8_FORMAT"] == "E4M3"
    assert env["ACCELERATE_FP8_AMAX_HISTORY_LEN"] == "32"
    assert env["ACCELERATE_FP8_MARGIN"] == "2"  # --env is applied last
    assert "ACCELERATE_FP8_OPT_LEVEL" not in env  # not given: the worker's default applies


def test_bad_fp8_backend_flag_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--fp8_backend", "fast", "t.py")
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_megatron_flags_imply_megatron(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(launch, "run", lambda plan, env, replace_process=True: seen.update(env=env))
    args = _parse(
        "--cpu", "--megatron_lm_tp_degree", "2", "--megatron_lm_recompute_activations", "yes",
        "--megatron_lm_gradient_clipping", "0.5", "t.py",
    )  # fmt: skip
    launch.run_launch(args, replace_process=False)
    env = seen["env"]
    assert env["ACCELERATE_USE_MEGATRON_LM"] == "true"
    assert env["MEGATRON_LM_TP_DEGREE"] == "2"
    assert env["MEGATRON_LM_RECOMPUTE_ACTIVATIONS"] == "true"
    assert env["MEGATRON_LM_GRADIENT_CLIPPING"] == "0.5"
    assert _parse("--use_megatron_lm", "t.py").use_megatron_lm is True


def test_megatron_flag_values_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--megatron_lm_tp_degree", "two", "t.py")
    assert "invalid int value: 'two'" in capsys.readouterr().err

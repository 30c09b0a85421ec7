"""`hasten launch --use_deepspeed ...`: flags and config keys become the plugin's variables; the
multi-node launchers build the command DeepSpeed's runner takes (no remote host is started)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hasten.commands.launch import launch_command_parser, prepare_deepspeed_cmd_env
from hasten.config.deepspeed import DeepSpeedPlugin
from hasten.launchers.deepspeed import deepspeed_runner_command, write_deepspeed_env
from hasten.launchers.env import plugin_env
from hasten.launchers.options import option_env
from hasten.launchers.plan import LaunchPlan


def _args(*argv: str) -> argparse.Namespace:
    return launch_command_parser().parse_args([*argv, "train.py", "--lr", "1"])


def test_deepspeed_flags_become_the_plugins_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(
        "--use_deepspeed",
        "--zero_stage",
        "3",
        "--offload_optimizer_device",
        "CPU",
        "--offload_param_device",
        "nvme",
        "--offload_param_nvme_path",
        "/nvme",
        "--gradient_clipping",
        "0.5",
        "--zero3_init_flag",
        "true",
        "--zero3_save_16bit_model",
        "yes",
        "--deepspeed_moe_layer_cls_names",
        "MixtralBlock",
    )
    env = option_env(args)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    assert env["ACCELERATE_GRADIENT_CLIPPING"] == "0.5"
    assert env["ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"] == "true"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plugin = DeepSpeedPlugin()  # what the worker builds from those variables
    assert plugin.zero_stage == 3 and plugin.gradient_clipping == 0.5
    assert plugin.offload_optimizer_device == "cpu" and plugin.offload_param_device == "nvme"
    assert plugin.offload_param_nvme_path == "/nvme"
    assert plugin.zero3_init_flag is True and plugin.zero3_save_16bit_model is True
    assert plugin.transformer_moe_cls_names == "MixtralBlock"


def test_a_zero_stage_flag_implies_deepspeed_and_bad_values_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert option_env(_args("--zero_stage", "2"))["ACCELERATE_USE_DEEPSPEED"] == "true"
    with pytest.raises(SystemExit):
        _args("--zero_stage", "4")
    assert "invalid choice: '4'" in capsys.readouterr().err


def test_config_file_and_launch_flags_together_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    env = option_env(_args("--deepspeed_config_file", "ds.json", "--zero_stage", "2"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"launch settings \['zero_stage'\]"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}})


def test_deepspeed_config_section_of_a_config_file() -> None:
    config = {
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {
            "zero_stage": 2,
            "offload_optimizer_device": "cpu",
            "gradient_clipping": 1.0,
            "zero3_init_flag": False,
            "deepspeed_config_file": "ds.json",
        },
    }
    env = plugin_env(config)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    assert env["ACCELERATE_GRADIENT_CLIPPING"] == "1.0"
    assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "false"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == "ds.json"


def _plan(**kwargs: object) -> LaunchPlan:
    base: dict[str, object] = {
        "script": "train.py",
        "script_args": ("--lr", "1"),
        "num_processes": 16,
        "num_machines": 2,
        "machine_rank": 1,
        "main_process_ip": "10.0.0.1",
        "main_process_port": 29600,
    }
    return LaunchPlan(**{**base, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("launcher", ["pdsh", "openmpi", "mvapich", "slurm", "mpich"])
def test_multinode_launchers_build_the_runner_command(launcher: str) -> None:
    cmd = deepspeed_runner_command(_plan(), launcher=launcher, hostfile="hosts")
    assert cmd == [
        "deepspeed",
        "--hostfile",
        "hosts",
        "--no_local_rank",
        "--launcher",
        launcher,
        "--num_gpus",
        "8",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "29600",
        "train.py",
        "--lr",
        "1",
    ]


def test_nossh_filters_and_module() -> None:
    cmd = deepspeed_runner_command(
        _plan(module=True), launcher="nossh", hostfile="hosts", inclusion_filter="w1:0,1"
    )
    assert cmd[3:8] == ["--node_rank", "1", "--no_ssh", "--include", "w1:0,1"]
    assert cmd[-4:] == ["--module", "train.py", "--lr", "1"]
    excluded = deepspeed_runner_command(
        _plan(), launcher="pdsh", hostfile="h", exclusion_filter="w2"
    )
    assert excluded[6:8] == ["--exclude", "w2"] and "--num_gpus" not in excluded


def test_runner_command_bad_input() -> None:
    with pytest.raises(ValueError, match="pass --deepspeed_hostfile PATH"):
        deepspeed_runner_command(_plan(), launcher="pdsh", hostfile=None)
    with pytest.raises(ValueError, match="takes one of them"):
        deepspeed_runner_command(
            _plan(), launcher="pdsh", hostfile="h", exclusion_filter="a", inclusion_filter="b"
        )


def test_prepare_deepspeed_cmd_env_from_launch_arguments(tmp_path: Path) -> None:
    args = _args(
        "--use_deepspeed",
        "--zero_stage",
        "2",
        "--num_machines",
        "2",
        "--num_processes",
        "4",
        "--machine_rank",
        "0",
        "--main_process_ip",
        "10.0.0.1",
        "--deepspeed_multinode_launcher",
        "openmpi",
        "--deepspeed_hostfile",
        "hosts",
    )
    cmd, env = prepare_deepspeed_cmd_env(args)
    assert cmd[:6] == [
        "deepspeed",
        "--hostfile",
        "hosts",
        "--no_local_rank",
        "--launcher",
        "openmpi",
    ]
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    written = write_deepspeed_env(env, ["ACCELERATE_DEEPSPEED_ZERO_STAGE"], tmp_path)
    assert written.read_text() == "ACCELERATE_DEEPSPEED_ZERO_STAGE=2\n"
    with pytest.raises(ValueError, match="holds a newline"):
        write_deepspeed_env({"X": "a\nb"}, ["X"], tmp_path)

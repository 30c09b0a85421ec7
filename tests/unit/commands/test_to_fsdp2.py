"""hasten to-fsdp2: FSDP1 config keys become FSDP2 ones; the launcher then carries them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hasten.commands.to_fsdp2 import convert_config_to_fsdp2
from hasten.launchers.env import plugin_env

FSDP1 = {
    "distributed_type": "FSDP",
    "fsdp_config": {
        "fsdp_version": 1,
        "fsdp_sharding_strategy": "SHARD_GRAD_OP",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_forward_prefetch": False,
        "fsdp_use_orig_params": True,
        "fsdp_sync_module_states": True,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    },
}


def test_convert_renames_translates_and_drops() -> None:
    converted = convert_config_to_fsdp2(FSDP1)
    assert converted["fsdp_config"] == {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    }
    env = plugin_env(converted)
    assert env["FSDP_VERSION"] == "2" and env["FSDP_RESHARD_AFTER_FORWARD"] == "false"
    assert "FSDP_BACKWARD_PREFETCH" not in env and env["ACCELERATE_USE_FSDP"] == "true"
    assert convert_config_to_fsdp2(converted) == converted  # already FSDP2: unchanged


def test_unknown_sharding_strategy_is_an_error() -> None:
    bad = {"fsdp_config": {"fsdp_sharding_strategy": "HALF_SHARD"}}
    with pytest.raises(ValueError, match="HALF_SHARD.*known FSDP1 sharding strategy"):
        convert_config_to_fsdp2(bad)


def test_command_writes_the_file_and_refuses_to_overwrite(tmp_path: Path) -> None:
    source, target = tmp_path / "fsdp1.yaml", tmp_path / "fsdp2.yaml"
    source.write_text(yaml.safe_dump(FSDP1))
    hasten = Path(sys.executable).parent / "hasten"
    command = [str(hasten), "to-fsdp2", "--config_file", str(source), "--output_file", str(target)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(target.read_text())["fsdp_config"]["fsdp_version"] == 2
    again = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode != 0 and "--overwrite" in again.stderr + again.stdout


def test_command_arguments_as_accelerate_checks_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from hasten.commands.to_fsdp2 import to_fsdp2_command, to_fsdp2_command_parser

    parser = to_fsdp2_command_parser()
    source = tmp_path / "fsdp1.yaml"
    with pytest.raises(FileNotFoundError, match=r"^Config file .*nope.yaml not found"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "nope.yaml")]))
    source.write_text(yaml.safe_dump(FSDP1))
    with pytest.raises(ValueError, match=r"^If --overwrite is not set, --output_file must be"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(source)]))
    taken = tmp_path / "taken.yaml"
    taken.write_text("x: 1\n")
    with pytest.raises(FileExistsError, match=r"^Output file .*taken.yaml already exists"):
        to_fsdp2_command(
            parser.parse_args(["--config_file", str(source), "--output_file", str(taken)])
        )
    # --overwrite alone rewrites the config file in place
    to_fsdp2_command(parser.parse_args(["--config_file", str(source), "--overwrite"]))
    assert yaml.safe_load(source.read_text())["fsdp_config"]["fsdp_version"] == 2
    with caplog.at_level("WARNING"):  # already FSDP2: left as it is, with Accelerate's warning
        to_fsdp2_command(parser.parse_args(["--config_file", str(source), "--overwrite"]))
    assert "Config already specifies FSDP2, skipping conversion..." in caplog.text

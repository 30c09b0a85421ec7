"""Launch options table: flags and config keys become the FSDP_* worker variables."""

from __future__ import annotations

import argparse

import pytest

from hasten.launchers.env import plugin_env
from hasten.launchers.options import LAUNCH_OPTIONS, add_option_flags, option_env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_option_flags(parser)
    return parser


def test_flags_become_worker_variables() -> None:
    args = _parser().parse_args(
        [
            "--use_fsdp",
            "--fsdp_version",
            "2",
            "--fsdp_offload_params",
            "yes",
            "--fsdp_auto_wrap_policy",
            "size_based_wrap",
            "--fsdp_min_num_params",
            "100",
        ]
    )
    env = option_env(args)
    assert env == {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": "2",
        "FSDP_OFFLOAD_PARAMS": "true",
        "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP",
        "FSDP_MIN_NUM_PARAMS": "100",
    }
    assert option_env(_parser().parse_args([])) == {}
    # an --fsdp_* setting is never silently dropped: it switches FSDP on
    assert (
        option_env(_parser().parse_args(["--fsdp_version", "1"]))["ACCELERATE_USE_FSDP"] == "true"
    )


@pytest.mark.parametrize(
    "argv",
    [["--fsdp_version", "3"], ["--fsdp_offload_params", "maybe"], ["--fsdp_state_dict_type", "x"]],
)
def test_bad_flag_values_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    err = capsys.readouterr().err
    assert "invalid" in err or "is not a boolean" in err


def test_every_option_has_its_config_key_and_variable() -> None:
    config = {"distributed_type": "FSDP", "fsdp_config": {o.dest: "1" for o in LAUNCH_OPTIONS}}
    env = plugin_env(config)
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert {o.env for o in LAUNCH_OPTIONS} <= set(env)

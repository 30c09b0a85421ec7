"""Launch options table: flags and config keys become the FSDP_* worker variables."""

from __future__ import annotations

import argparse

import pytest

from hasten.launchers.env import plugin_env
from hasten.launchers.options import (
    LAUNCH_OPTIONS,
    add_option_flags,
    check_parallelism_sizes,
    option_env,
    prepare_extend_env_parallelism_config,
)


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


def test_parallelism_flags_become_worker_variables() -> None:
    args = _parser().parse_args(
        ["--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2"]
    )
    assert option_env(args) == {
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
        # a parallelism_config setting switches the config on (as --use_parallelism_config)
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
    }
    assert "ACCELERATE_USE_FSDP" not in option_env(args)
    current = {"PATH": "/bin"}
    assert prepare_extend_env_parallelism_config(args, current) is current
    assert current["PARALLELISM_CONFIG_TP_SIZE"] == "2" and current["PATH"] == "/bin"


def test_parallelism_config_section_becomes_worker_variables() -> None:
    config = {
        "parallelism_config": {
            "parallelism_config_dp_replicate_size": 1,
            "parallelism_config_tp_size": 2,
            "parallelism_config_cp_comm_strategy": "alltoall",
        }
    }
    assert plugin_env(config) == {
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
        "PARALLELISM_CONFIG_CP_COMM_STRATEGY": "alltoall",
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
    }


def test_parallelism_sizes_must_multiply_to_the_process_count() -> None:
    env = {"PARALLELISM_CONFIG_DP_SHARD_SIZE": "2", "PARALLELISM_CONFIG_TP_SIZE": "2"}
    check_parallelism_sizes(env, 4)
    check_parallelism_sizes({}, 3)
    with pytest.raises(
        ValueError,
        match=r"multiply to 4 \(dp_shard_size=2 x tp_size=2\), but the launch starts 2 process\(es\); use "
        r"--num_processes 4",
    ):
        check_parallelism_sizes(env, 2)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--parallelism_config_cp_comm_strategy", "ring"])


_FSDP_FLAGS = {
    "fsdp_sharding_strategy": "SHARD_GRAD_OP",
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_transformer_layer_cls_to_wrap": "Block,Head",
    "fsdp_min_num_params": "7",
    "fsdp_offload_params": "true",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    "fsdp_backward_prefetch": "BACKWARD_POST",
    "fsdp_forward_prefetch": "true",
    "fsdp_use_orig_params": "true",
    "fsdp_cpu_ram_efficient_loading": "true",
    "fsdp_sync_module_states": "true",
    "fsdp_activation_checkpointing": "true",
}


@pytest.mark.parametrize("version", ["1", "2"])
def test_each_fsdp_flag_and_config_key_reaches_its_plugin_field(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        CPUOffload,
        CPUOffloadPolicy,
        ShardingStrategy,
        StateDictType,
    )
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from hasten.config.envvars import read_prefixed
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    given = dict(_FSDP_FLAGS, fsdp_version=version)
    if version == "2":  # FSDP1-only settings are left out; reshard_after_forward is a bool
        for name in ("sharding_strategy", "backward_prefetch", "forward_prefetch"):
            del given[f"fsdp_{name}"]
        for name in ("use_orig_params", "sync_module_states"):
            del given[f"fsdp_{name}"]
        given["fsdp_reshard_after_forward"] = "false"
    argv = ["--use_fsdp"] + [item for key, value in given.items() for item in (f"--{key}", value)]
    env = option_env(_parser().parse_args(argv))
    config = {"distributed_type": "FSDP", "fsdp_config": given}
    assert plugin_env(config) == env  # a config file's fsdp_config carries the same variables
    for name in read_prefixed("FSDP_"):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == int(version)
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy
    assert plugin.transformer_cls_names_to_wrap == ["Block", "Head"]
    assert plugin.state_dict_type is StateDictType.SHARDED_STATE_DICT
    assert plugin.cpu_ram_efficient_loading is True
    assert plugin.activation_checkpointing is True
    if version == "1":
        assert plugin.sharding_strategy is ShardingStrategy.SHARD_GRAD_OP
        assert plugin.cpu_offload == CPUOffload(offload_params=True)
        assert plugin.backward_prefetch is BackwardPrefetch.BACKWARD_POST
        assert (plugin.forward_prefetch, plugin.use_orig_params) == (True, True)
        assert plugin.sync_module_states is True
    else:
        assert plugin.reshard_after_forward is False
        assert isinstance(plugin.cpu_offload, CPUOffloadPolicy)
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "SIZE_BASED_WRAP")
    size = FullyShardedDataParallelPlugin()
    assert size.min_num_params == 7

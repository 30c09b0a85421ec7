"""config.fsdp: FullyShardedDataParallelPlugin normalisation, env defaults and errors."""

from __future__ import annotations

import functools
import os

import pytest
import torch
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    FullStateDictConfig,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

from hasten.config.envvars import read_prefixed
from hasten.config.fsdp import FullyShardedDataParallelPlugin as Plugin
from hasten.config.fsdp import get_module_class_from_name


@pytest.fixture(autouse=True)
def _no_fsdp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in read_prefixed("FSDP_"):
        monkeypatch.delenv(name)


def test_fsdp1_defaults() -> None:
    plugin = Plugin()
    assert plugin.fsdp_version == 1
    assert plugin.sharding_strategy is ShardingStrategy.FULL_SHARD
    assert plugin.reshard_after_forward is None
    assert plugin.cpu_offload == CPUOffload(offload_params=False)
    assert plugin.backward_prefetch is None
    assert plugin.state_dict_type is StateDictType.FULL_STATE_DICT
    assert isinstance(plugin.state_dict_config, FullStateDictConfig)
    assert plugin.auto_wrap_policy is None
    assert (plugin.use_orig_params, plugin.sync_module_states, plugin.forward_prefetch) == (
        False,
        False,
        False,
    )
    assert plugin.activation_checkpointing is False
    assert plugin.limit_all_gathers is True


def test_fsdp2_defaults() -> None:
    plugin = Plugin(fsdp_version=2)
    assert plugin.reshard_after_forward is True
    assert isinstance(plugin.cpu_offload, OffloadPolicy)
    assert not isinstance(plugin.cpu_offload, CPUOffloadPolicy)
    assert plugin.state_dict_type is StateDictType.SHARDED_STATE_DICT
    assert isinstance(plugin.state_dict_config, ShardedStateDictConfig)
    assert (plugin.use_orig_params, plugin.sync_module_states, plugin.forward_prefetch) == (
        None,
        None,
        None,
    )


def test_values_come_from_the_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "FSDP_SHARDING_STRATEGY": "shard_grad_op",
        "FSDP_OFFLOAD_PARAMS": "true",
        "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE",
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
        "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP",
        "FSDP_MIN_NUM_PARAMS": "100",
        "FSDP_USE_ORIG_PARAMS": "1",
        "FSDP_FORWARD_PREFETCH": "true",
        "FSDP_ACTIVATION_CHECKPOINTING": "true",
        "FSDP_IGNORED_MODULES": "head.*",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = Plugin()
    assert plugin.sharding_strategy is ShardingStrategy.SHARD_GRAD_OP
    assert plugin.cpu_offload == CPUOffload(offload_params=True)
    assert plugin.backward_prefetch is BackwardPrefetch.BACKWARD_PRE
    assert plugin.state_dict_type is StateDictType.SHARDED_STATE_DICT
    assert plugin.auto_wrap_policy is size_based_auto_wrap_policy
    assert plugin.min_num_params == 100
    assert plugin.use_orig_params is True
    assert plugin.forward_prefetch is True
    assert plugin.activation_checkpointing is True
    assert plugin.ignored_modules == "head.*"


def test_fsdp_version_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    plugin = Plugin()
    assert (plugin.fsdp_version, plugin.reshard_after_forward) == (2, False)


@pytest.mark.parametrize(
    "value", ["HYBRID_SHARD", "hybrid_shard", 4, "4", ShardingStrategy.HYBRID_SHARD]
)
def test_sharding_strategy_spellings(value: object) -> None:
    assert Plugin(sharding_strategy=value).sharding_strategy is ShardingStrategy.HYBRID_SHARD


def test_fsdp1_reshard_after_forward_is_a_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "FULL_SHARD")  # the argument wins
    plugin = Plugin(sharding_strategy=None, reshard_after_forward="NO_SHARD")
    assert plugin.reshard_after_forward is ShardingStrategy.NO_SHARD
    assert plugin.sharding_strategy is None  # not FULL_SHARD: the strategy uses NO_SHARD
    monkeypatch.delenv("FSDP_SHARDING_STRATEGY")
    monkeypatch.setenv(
        "FSDP_RESHARD_AFTER_FORWARD", "shard_grad_op"
    )  # --fsdp_reshard_after_forward
    plugin = Plugin(fsdp_version=1)
    assert (plugin.sharding_strategy, plugin.reshard_after_forward) == (
        None,
        ShardingStrategy.SHARD_GRAD_OP,
    )
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "FULL_SHARD")
    with pytest.raises(
        ValueError,
        match=r"sharding_strategy=FULL_SHARD, reshard_after_forward="
        r"SHARD_GRAD_OP\) disagree.*give only one of them",
    ):
        Plugin(fsdp_version=1)
    same = Plugin(sharding_strategy="NO_SHARD", reshard_after_forward=ShardingStrategy.NO_SHARD)
    assert same.sharding_strategy is same.reshard_after_forward


def test_backward_prefetch_spellings() -> None:
    assert (
        Plugin(backward_prefetch="backward_post").backward_prefetch
        is BackwardPrefetch.BACKWARD_POST
    )
    assert Plugin(backward_prefetch="NO_PREFETCH").backward_prefetch is None


def test_fsdp2_drops_fsdp1_only_options_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="backward_prefetch is not supported by FSDP2"):
        plugin = Plugin(fsdp_version=2, backward_prefetch="BACKWARD_PRE", use_orig_params=True)
    assert plugin.backward_prefetch is None
    assert plugin.use_orig_params is None
    with pytest.warns(UserWarning, match="sharding_strategy is deprecated"):
        Plugin(fsdp_version=2, sharding_strategy="FULL_SHARD", reshard_after_forward=True)
    with pytest.warns(UserWarning, match="FSDP2 always limits all-gathers in flight"):
        Plugin(fsdp_version=2, limit_all_gathers=False)


def test_cpu_offload_objects() -> None:
    assert isinstance(Plugin(fsdp_version=2, cpu_offload=True).cpu_offload, CPUOffloadPolicy)
    given = CPUOffload(offload_params=True)
    assert Plugin(cpu_offload=given).cpu_offload is given


def test_cpu_ram_efficient_loading_forces_sync_and_exports_the_variable() -> None:
    with pytest.warns(UserWarning, match="needs sync_module_states"):
        plugin = Plugin(cpu_ram_efficient_loading=True)
    assert plugin.sync_module_states is True
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"fsdp_version": 3}, ValueError, r"fsdp_version=3\) must be 1 or 2"),
        (
            {"sharding_strategy": "SHARD_ALL"},
            ValueError,
            r"sharding_strategy='SHARD_ALL'\) is not valid.*FULL_SHARD",
        ),
        ({"sharding_strategy": 9}, ValueError, r"sharding_strategy=9\) is not valid"),
        (
            {"fsdp_version": 2, "reshard_after_forward": "FULL_SHARD"},
            ValueError,
            r"must be a bool with fsdp_version=2",
        ),
        (
            {"reshard_after_forward": True, "sharding_strategy": None},
            ValueError,
            r"must be a sharding strategy with fsdp_version=1",
        ),
        (
            {"backward_prefetch": "sideways"},
            ValueError,
            r"backward_prefetch='sideways'\) is not valid",
        ),
        (
            {"cpu_offload": "yes"},
            ValueError,
            r"cpu_offload='yes'\) must be a bool or a torch.distributed.fsdp.CPUOffload",
        ),
        (
            {"fsdp_version": 2, "cpu_offload": CPUOffload()},
            ValueError,
            r"OffloadPolicy with fsdp_version=2",
        ),
        ({"state_dict_type": "PICKLED"}, ValueError, r"state_dict_type='PICKLED'\) is not valid"),
        (
            {"fsdp_version": 2, "state_dict_type": "LOCAL_STATE_DICT"},
            ValueError,
            r"not supported by FSDP2",
        ),
        (
            {"auto_wrap_policy": "layer_wrap"},
            ValueError,
            r"auto_wrap_policy='layer_wrap'\) is not a known policy",
        ),
        ({"auto_wrap_policy": 5}, TypeError, r"auto_wrap_policy=5\) must be a callable"),
        (
            {"auto_wrap_policy": "size_based_wrap", "min_num_params": "10"},
            ValueError,
            r"min_num_params='10'\) must be an int",
        ),
        ({"fsdp_version": 2, "forward_prefetch": True}, ValueError, r"not implemented by FSDP2"),
        (
            {"fsdp_version": 2, "sharding_strategy": "FULL_SHARD"},
            ValueError,
            r"sharding_strategy=.*FULL_SHARD.*FSDP1's setting.*reshard_after_forward instead",
        ),
        (
            {"fsdp_version": 2, "param_init_fn": lambda module: None},
            ValueError,
            r"param_init_fn=...\) is FSDP1's.*cpu_ram_efficient_loading=True",
        ),
        (
            {"activation_checkpointing_offload": True},
            ValueError,
            r"needs activation_checkpointing=True",
        ),
        (
            {"activation_checkpointing_offload": True, "activation_checkpointing": True},
            ValueError,
            r"needs fsdp_version=2",
        ),
        (
            {"mixed_precision_policy": "fp64"},
            ValueError,
            r"'fp64' is not valid; use one of \['fp8', 'fp16', 'bf16', 'fp32'\]",
        ),
        (
            {"mixed_precision_policy": {"param_dtype": torch.float16}},
            ValueError,
            r"missing \['reduce_dtype', 'buffer_dtype'\]",
        ),
        (
            {
                "mixed_precision_policy": {
                    "param_dtype": torch.int8,
                    "reduce_dtype": torch.float16,
                    "buffer_dtype": torch.float16,
                }
            },
            ValueError,
            r"bad: \['param_dtype'\]",
        ),
        (
            {"mixed_precision_policy": 12},
            ValueError,
            r"must be a torch.distributed.fsdp.MixedPrecision",
        ),
    ],
)
def test_errors(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Plugin(**options)


def test_mixed_precision_by_name_and_dict() -> None:
    plugin = Plugin(mixed_precision_policy="bf16")
    assert plugin.mixed_precision_policy == MixedPrecision(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16
    )
    plugin = Plugin(
        mixed_precision_policy={
            "param_dtype": torch.float16,
            "reduce_dtype": torch.float32,
            "buffer_dtype": torch.float16,
        }
    )
    assert plugin.mixed_precision_policy.reduce_dtype == torch.float32  # type: ignore[union-attr]
    plugin = Plugin(fsdp_version=2, mixed_precision_policy="fp8")
    assert isinstance(plugin.mixed_precision_policy, MixedPrecisionPolicy)
    assert plugin.mixed_precision_policy.output_dtype == torch.bfloat16


def test_set_mixed_precision_override_and_buffer_autocast() -> None:
    plugin = Plugin()
    plugin.set_mixed_precision("fp16", buffer_autocast=True)
    assert plugin.mixed_precision_policy.buffer_dtype == torch.float32  # type: ignore[union-attr]
    plugin.set_mixed_precision("bf16")  # kept: not overriding
    assert plugin.mixed_precision_policy.param_dtype == torch.float16  # type: ignore[union-attr]
    plugin.set_mixed_precision(torch.bfloat16, override=True)
    assert plugin.mixed_precision_policy.param_dtype == torch.bfloat16  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"dtype torch.int8 is not valid"):
        plugin.set_mixed_precision(torch.int8, override=True)


def test_validate_mixed_precision_policy() -> None:
    plugin = Plugin(fsdp_version=2, mixed_precision_policy="fp16")
    plugin.validate_mixed_precision_policy()
    plugin.mixed_precision_policy = MixedPrecision()
    with pytest.raises(ValueError, match="must be a torch.distributed.fsdp.MixedPrecisionPolicy"):
        plugin.validate_mixed_precision_policy()


def test_set_state_dict_type_switches_configs() -> None:
    plugin = Plugin()
    plugin.set_state_dict_type("SHARDED_STATE_DICT")
    assert plugin.state_dict_type is StateDictType.SHARDED_STATE_DICT
    # Existing configs are kept; only missing ones are filled.
    assert isinstance(plugin.state_dict_config, FullStateDictConfig)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)


class Net(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])


def test_transformer_wrap_from_names_env_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = Plugin(auto_wrap_policy="transformer_based_wrap")
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy
    plugin.set_auto_wrap_policy(Net())  # falls back to model._no_split_modules
    assert isinstance(plugin.auto_wrap_policy, functools.partial)
    assert plugin.auto_wrap_policy.keywords["transformer_layer_cls"] == {Block}

    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "Block,Linear")
    plugin = Plugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP")
    assert plugin.transformer_cls_names_to_wrap == ["Block", "Linear"]
    plugin.set_auto_wrap_policy(Net())
    assert plugin.auto_wrap_policy.keywords["transformer_layer_cls"] == {Block, torch.nn.Linear}  # type: ignore[union-attr]


def test_transformer_wrap_unknown_class_lists_the_model_classes() -> None:
    plugin = Plugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Decoder"]
    )
    with pytest.raises(ValueError, match=r"'Decoder', which is not a layer class.*'Block'"):
        plugin.set_auto_wrap_policy(Net())


def test_size_wrap_binds_min_num_params() -> None:
    plugin = Plugin(auto_wrap_policy="size_based_wrap", min_num_params=10)
    plugin.set_auto_wrap_policy(Net())
    assert plugin.auto_wrap_policy.keywords == {"min_num_params": 10}  # type: ignore[union-attr]
    with pytest.warns(UserWarning, match=r"min_num_params=0 wraps no submodule"):
        plugin = Plugin(auto_wrap_policy="size_based_wrap")
    plugin.set_auto_wrap_policy(Net())
    assert plugin.auto_wrap_policy is None


def test_callable_policy_is_kept() -> None:
    def policy(*args: object, **kwargs: object) -> bool:
        return False

    plugin = Plugin(auto_wrap_policy=policy)
    plugin.set_auto_wrap_policy(Net())
    assert plugin.auto_wrap_policy is policy


def test_get_module_class_from_name() -> None:
    assert get_module_class_from_name(Net(), "Linear") is torch.nn.Linear
    assert get_module_class_from_name(Net(), "Net") is Net
    assert get_module_class_from_name(Net(), "Conv2d") is None


def test_fsdp_constants_and_the_fsdp2_torch_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.utils import constants

    assert constants.FSDP_MODEL_NAME == "pytorch_model_fsdp"
    assert (constants.FSDP_PYTORCH_VERSION, constants.FSDP2_PYTORCH_VERSION) == ("2.1.0", "2.6.0")
    assert constants.FSDP_SHARDING_STRATEGY[0] == "FULL_SHARD"  # index + 1 = torch's enum value
    assert constants.FSDP2_STATE_DICT_TYPE == ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
    monkeypatch.setattr("hasten.config.fsdp.is_torch_version", lambda op, version: False)
    with pytest.raises(ImportError, match=r"fsdp_version=2\) needs torch >= 2.6.0.*fsdp_version=1"):
        Plugin(fsdp_version=2)
    assert Plugin(fsdp_version=1).fsdp_version == 1

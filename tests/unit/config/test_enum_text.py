"""Enums print as ``Class.MEMBER`` (Accelerate); every place that turns one into text uses its value."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from hasten.commands.config.config_args import ClusterConfig
from hasten.commands.config.default import write_basic_config
from hasten.config import envvars
from hasten.config.dynamo import TorchDynamoPlugin
from hasten.config.enums import (
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    LoggerType,
    PrecisionType,
)
from hasten.config.kwargs import DistributedDataParallelKwargs
from hasten.launchers.env import plugin_env
from hasten.precision.amp import make_grad_scaler
from hasten.state import AcceleratorState


def test_env_vars_get_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    envvars.write("ACCELERATE_MIXED_PRECISION", PrecisionType.BF16)
    assert envvars.read("ACCELERATE_MIXED_PRECISION") == "bf16"
    envvars.write("ACCELERATE_LOG_WITH", [LoggerType.TENSORBOARD, LoggerType.WANDB])
    assert envvars.read("ACCELERATE_LOG_WITH") == "tensorboard,wandb"


def test_launcher_engine_flag_and_lists_from_enums() -> None:
    values = plugin_env(
        {"distributed_type": DistributedType.FSDP, "fsdp_config": {"fsdp_version": 2}}
    )
    assert values["ACCELERATE_USE_FSDP"] == "true"


def test_config_files_hold_values(tmp_path: Path) -> None:
    path = write_basic_config(PrecisionType.BF16, save_location=str(tmp_path / "c.yaml"))
    assert isinstance(path, str)
    data = yaml.safe_load(Path(path).read_text())
    assert data["mixed_precision"] == "bf16"
    assert data["distributed_type"] == "NO"
    config = ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        distributed_type=DistributedType.MULTI_CPU,
        mixed_precision=PrecisionType.FP16,
        use_cpu=True,
        debug=False,
        num_processes=2,
    )
    saved = Path(config.save(str(tmp_path / "d.yaml")))
    text = saved.read_text()
    assert "MULTI_CPU" in text and "DistributedType" not in text and "PrecisionType" not in text


def test_enum_arguments_are_read_by_value() -> None:
    state = AcceleratorState(mixed_precision=PrecisionType.BF16, cpu=True, _from_accelerator=True)
    assert state.mixed_precision == "bf16"
    assert TorchDynamoPlugin(backend=DynamoBackend.EAGER).backend is DynamoBackend.EAGER
    scaler = make_grad_scaler("cpu", distributed_type=DistributedType.FSDP)
    assert type(scaler).__name__ == "ShardedGradScaler"
    assert not isinstance(make_grad_scaler("cpu", DistributedType.MULTI_CPU), type(scaler))
    assert isinstance(make_grad_scaler("cpu"), torch.amp.GradScaler)


def test_messages_name_values() -> None:
    with pytest.raises(ValueError, match="comm_wrapper='fp16'") as info:
        DistributedDataParallelKwargs(comm_wrapper=DDPCommunicationHookType.FP16)
    assert "DDPCommunicationHookType" not in str(info.value)
    with pytest.raises(ValueError, match=r"comm_hook='fp16'"):
        DistributedDataParallelKwargs(
            comm_hook=DDPCommunicationHookType.FP16, comm_state_option={"x": 1}
        )

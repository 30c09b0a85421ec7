"""The Accelerator with DeepSpeed plugins, before any engine is built: choices and refusals."""

from __future__ import annotations

import pytest
import torch

from hasten import Accelerator
from hasten.config.deepspeed import DeepSpeedPlugin
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.state import AcceleratorState


def test_deepspeed_with_fsdp_is_refused() -> None:
    with pytest.raises(ValueError, match="Both an FSDP plugin and a DeepSpeed plugin"):
        Accelerator(
            cpu=True,
            deepspeed_plugin=DeepSpeedPlugin(),
            fsdp_plugin=FullyShardedDataParallelPlugin(),
        )


def test_deepspeed_on_cpu_is_deepspeed_not_a_silent_fallback() -> None:
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    assert accelerator.distributed_type == "DEEPSPEED"
    assert accelerator.strategy.name == "deepspeed"
    assert accelerator.scaler is None  # DeepSpeed owns precision and loss scaling


def test_explicit_config_accumulation_is_adopted_or_conflicts() -> None:
    config = {"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=dict(config)))
    assert accelerator.gradient_accumulation_steps == 4
    AcceleratorState._reset_state()
    with pytest.raises(ValueError, match="gradient_accumulation_steps=4 but the Accelerator"):
        Accelerator(
            gradient_accumulation_steps=2,
            deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=dict(config)),
        )


def test_unknown_plugin_name_in_select_lists_the_names() -> None:
    accelerator = Accelerator(
        deepspeed_plugins={"student": DeepSpeedPlugin(), "teacher": DeepSpeedPlugin(zero_stage=3)}
    )
    assert accelerator.deepspeed_plugin.zero_stage == 2
    accelerator.state.select_deepspeed_plugin("teacher")
    assert accelerator.deepspeed_plugin.zero_stage == 3
    with pytest.raises(KeyError, match=r"'nope'; registered names: \['student', 'teacher'\]"):
        accelerator.state.select_deepspeed_plugin("nope")


def test_one_engine_per_prepare_call() -> None:
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="one model with at most one optimizer"):
        accelerator.prepare(first, second)
    optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="one model with at most one optimizer"):
        accelerator.prepare(optimizer)


def test_backward_without_an_engine_says_what_to_prepare() -> None:
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    with pytest.raises(RuntimeError, match="prepared together with its optimizer"):
        accelerator.backward(torch.ones((), requires_grad=True))


def test_ulysses_adapter_passes_loaders_through_without_sequence_parallelism() -> None:
    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(list(range(4)))
    assert accelerator.deepspeed_ulysses_dl_adapter(loader, torch.nn.Linear(1, 1)) is loader

"""Inputs Accelerate accepts loosely are accepted by hasten too (issue 20's audit).

Each case was run against Accelerate 1.15 and passed there; before the audit hasten refused it.
transformers, trl, peft and diffusers pass such values (numpy counts, floats from arithmetic,
flags as ints), so refusing them breaks those libraries.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hasten import Accelerator
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.config.parallelism import ParallelismConfig
from hasten.config.project import DataLoaderConfiguration
from hasten.core.coerce import whole_number
from hasten.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
from hasten.utils import reduce, send_to_device


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.int64(3), 3),
        (3, 3),
        (3.0, 3),
        (np.float32(3.0), 3),
        (3.5, None),
        (True, None),
        ("3", None),
        (None, None),
    ],
)
def test_whole_number(value: object, expected: int | None) -> None:
    got = whole_number(value)
    assert got == expected and (got is None or type(got) is int)


def test_accelerator_takes_numpy_accumulation_steps() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=np.int64(2))  # type: ignore[arg-type]
    assert accelerator.gradient_accumulation_steps == 2
    with pytest.raises(TypeError, match=r"gradient_accumulation_steps must be an int >= 1"):
        Accelerator(cpu=True, gradient_accumulation_steps=2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "expected"), [(1, True), (0, False), (None, True)])
def test_split_batches_takes_any_flag(given: object, expected: bool) -> None:
    # None counts as not given: the DataLoaderConfiguration's setting stays.
    config = DataLoaderConfiguration(split_batches=True)
    accelerator = Accelerator(cpu=True, split_batches=given, dataloader_config=config)  # type: ignore[arg-type]
    assert accelerator.split_batches is expected


def test_send_to_device_takes_a_non_bool_non_blocking() -> None:
    moved = send_to_device((torch.ones(1), "text"), "cpu", non_blocking=1)  # type: ignore[arg-type]
    assert isinstance(moved, tuple) and moved[1] == "text"


class _DuckHook:
    """A hook that does not subclass ModelHook: Accelerate takes it (duck typing)."""

    no_grad = False

    def __init__(self) -> None:
        self.calls = 0

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module

    def pre_forward(self, module: nn.Module, *args: object, **kwargs: object) -> tuple:
        self.calls += 1
        return args, kwargs

    def post_forward(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
        return output * 2

    def detach_hook(self, module: nn.Module) -> nn.Module:
        return module


def test_add_hook_to_module_takes_a_duck_typed_hook() -> None:
    layer = nn.Linear(1, 1, bias=False)
    nn.init.ones_(layer.weight)
    hook = _DuckHook()
    add_hook_to_module(layer, hook)  # type: ignore[arg-type]
    assert layer(torch.ones(1)).item() == 2.0 and hook.calls == 1
    remove_hook_from_module(layer)
    assert layer(torch.ones(1)).item() == 1.0
    add_hook_to_module(layer, ModelHook(), append=1)  # type: ignore[arg-type]


def test_add_hook_to_module_refuses_an_object_without_the_hook_methods() -> None:
    with pytest.raises(TypeError, match="without init_hook, pre_forward, post_forward"):
        add_hook_to_module(nn.Linear(1, 1), object())  # type: ignore[arg-type]


@pytest.mark.parametrize("version", ["2", np.int64(2), 2.0])
def test_fsdp_version_as_text_or_any_number(version: object) -> None:
    assert FullyShardedDataParallelPlugin(fsdp_version=version).fsdp_version == 2  # type: ignore[arg-type]


def test_parallelism_sizes_of_any_numeric_type() -> None:
    config = ParallelismConfig(dp_shard_size=np.int64(1), tp_size=1.0)  # type: ignore[arg-type]
    assert (config.dp_shard_size, config.tp_size) == (1, 1)
    assert type(config.tp_size) is int
    with pytest.raises(ValueError, match=r"tp_size=1.5\) must be an int >= 1"):
        ParallelismConfig(tp_size=1.5)  # type: ignore[arg-type]


def test_reduce_takes_the_reduction_in_any_case() -> None:
    Accelerator(cpu=True)
    assert reduce(torch.ones(2), reduction="MEAN").tolist() == [1.0, 1.0]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"reduction='avg'\) is not supported"):
        reduce(torch.ones(2), reduction="avg")  # type: ignore[arg-type]

"""Empty-weight init: nothing is allocated; buffers follow `include_buffers`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.big_modeling import init_empty_weights, init_on_device
from unit.big_modeling.bm_models import TinyLM


def test_init_empty_weights_puts_parameters_on_meta_and_keeps_buffers() -> None:
    with init_empty_weights():
        model = TinyLM()
        norm = nn.BatchNorm1d(4)
    assert all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.wte.weight
    assert not model.scale.is_meta and not norm.running_mean.is_meta
    assert not nn.Linear(2, 2).weight.is_meta  # patch undone on exit


def test_include_buffers_and_the_environment_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    register_parameter = nn.Module.register_parameter
    with init_empty_weights(include_buffers=True):
        # torch's device context does it all: nn.Module is not patched (as Accelerate checks)
        assert nn.Module.register_parameter is register_parameter
        norm = nn.BatchNorm1d(4)
        extra = torch.zeros(3)
    assert norm.running_mean.is_meta and norm.weight.is_meta and extra.is_meta
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "1")
    with init_empty_weights():
        norm = nn.BatchNorm1d(4)
    assert norm.running_mean.is_meta
    assert not torch.zeros(1).is_meta


def test_init_on_device_keeps_parameter_class_and_flags() -> None:
    class Tagged(nn.Parameter):
        pass

    with init_on_device(torch.device("meta")):
        layer = nn.Linear(3, 3)
        layer.extra = Tagged(torch.ones(2), requires_grad=False)
    assert type(layer.extra) is Tagged and layer.extra.is_meta and not layer.extra.requires_grad
    with init_on_device("cpu"):
        assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_big_model_costs_no_memory() -> None:
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(20_000, 20_000) for _ in range(10)])  # 16 GB in fp32
    assert sum(p.numel() for p in model.parameters()) > 4 * 10**9


def test_transformers_model_builds_empty() -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is optional")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(config)
    assert all(p.is_meta for p in model.parameters())

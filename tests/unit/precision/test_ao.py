"""torchao fp8 helpers: layer filters and conversion (conversion runs on CPU)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from hasten.core import imports
from hasten.core.imports import install_command
from hasten.precision.ao import (
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)

needs_torchao = pytest.mark.skipif(
    not imports.is_torchao_available(), reason="torchao is not installed"
)


def tower() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64),
        nn.ReLU(),
        nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 48)),
        nn.Linear(48, 10),
    )


def test_first_and_last_linear_names() -> None:
    assert find_first_last_linear_layers(tower()) == ("0", "3")
    assert find_first_last_linear_layers(nn.Sequential(nn.ReLU())) == (None, None)


def test_filter_linear_layers() -> None:
    assert filter_linear_layers(nn.Linear(32, 64), "a", layers_to_filter=[]) is True
    assert filter_linear_layers(nn.Linear(32, 64), "a", layers_to_filter=["a"]) is False
    # fp8 kernels need both sizes divisible by 16
    assert filter_linear_layers(nn.Linear(30, 64), "b", layers_to_filter=[]) is False
    assert filter_linear_layers(nn.Linear(32, 10), "b", layers_to_filter=[]) is False


def test_filter_first_and_last_looks_inside_the_module() -> None:
    # Accelerate's semantics: the first/last Linear of the module passed (its own children).
    block = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
    assert filter_first_and_last_linear_layers(block, "0") is False
    assert filter_first_and_last_linear_layers(block, "1") is True
    assert filter_first_and_last_linear_layers(block, "2") is False


@needs_torchao
def test_default_conversion_keeps_first_last_and_odd_sizes() -> None:
    from torchao.float8.float8_linear import Float8Linear

    model = tower()
    params = list(model.parameters())
    assert not has_ao_layers(model)
    assert convert_model_to_fp8_ao(model) is model
    assert has_ao_layers(model)
    assert type(model[0]) is nn.Linear  # first
    assert type(model[3]) is nn.Linear  # last
    assert isinstance(model[2][0], Float8Linear)
    assert isinstance(model[2][2], Float8Linear)  # 64 -> 48: both multiples of 16
    # the optimizer built before conversion still points at the live parameters
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]


@needs_torchao
def test_custom_filter_is_honoured() -> None:
    from torchao.float8.float8_linear import Float8Linear

    model = tower()
    convert_model_to_fp8_ao(model, module_filter_func=lambda module, fqn: fqn == "0")
    assert isinstance(model[0], Float8Linear)
    assert type(model[2][0]) is nn.Linear


@needs_torchao
def test_converted_model_trains_on_cpu() -> None:
    model = convert_model_to_fp8_ao(tower())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 32), torch.randint(0, 10, (64,))
    losses = []
    for _ in range(15):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_without_torchao_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "is_package_available", lambda name, min_version=None: False)
    with pytest.raises(ImportError, match=re.escape(install_command("torchao", "fp8"))):
        convert_model_to_fp8_ao(tower())
    with pytest.raises(ImportError, match="torchao"):
        has_ao_layers(tower())

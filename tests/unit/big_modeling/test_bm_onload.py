"""big_modeling.onload: offloaded weights brought back for reading and saving."""

from __future__ import annotations

import torch
from torch import nn

from hasten.big_modeling import cpu_offload
from hasten.big_modeling.onload import (
    align_module_device,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
)

_META = torch.device("meta")


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model.register_buffer("scale", torch.tensor([2.0]))
    return model


def test_offloaded_weights_are_real_inside_align_module_device_only() -> None:
    model = _model()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_offload(model, execution_device=torch.device("cpu"))
    layer = model[0]
    assert has_offloaded_params(layer) and not has_offloaded_params(model[1])
    assert layer.weight.device == _META
    with align_module_device(layer):
        assert layer.weight.device.type == "cpu"
        assert torch.equal(layer.weight, expected["0.weight"])
    assert layer.weight.device == _META


def test_align_module_device_moves_plain_parameters_and_back() -> None:
    layer = nn.Linear(2, 2)
    before = layer.weight.detach().clone()
    with align_module_device(layer, torch.device("meta")):
        assert layer.weight.device == _META
    assert layer.weight.device.type == "cpu" and torch.equal(layer.weight, before)
    with align_module_device(layer, torch.device("cpu")):
        layer.weight.data.fill_(3.0)
    assert torch.equal(layer.weight, torch.full((2, 2), 3.0)), "edits in the block are kept"
    with align_module_device(layer):  # nothing to do
        assert layer.weight.device.type == "cpu"


def test_state_dict_of_an_offloaded_model_matches_the_original() -> None:
    model = _model()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_offload(model, execution_device=torch.device("cpu"))
    state = get_state_dict_offloaded_model(model)
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for key, value in state.items():
        assert value.device.type == "cpu" and torch.equal(value, expected[key])


def test_get_state_dict_from_offload_fills_the_module_entries() -> None:
    model = _model()
    expected = model[2].weight.detach().clone()
    cpu_offload(model, execution_device=torch.device("cpu"))
    state: dict[str, str | torch.Tensor] = {"2.weight": "placeholder", "other": "kept"}
    get_state_dict_from_offload(model[2], "2.weight", state)
    assert isinstance(state["2.weight"], torch.Tensor)
    assert torch.equal(state["2.weight"], expected)
    assert state["other"] == "kept"

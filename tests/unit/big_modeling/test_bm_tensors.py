"""Moving, naming and re-tying module tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.big_modeling.init import init_empty_weights
from hasten.big_modeling.tensors import (
    as_device,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    get_module_children_bottom_up,
    get_non_persistent_buffers,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
    split_tensor_name,
)
from unit.big_modeling.bm_models import TinyLM


def test_set_module_tensor_to_device_fills_a_meta_parameter() -> None:
    with init_empty_weights():
        model = nn.Sequential(nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)
    value = torch.arange(6.0).reshape(2, 3)
    set_module_tensor_to_device(model, "0.weight", "cpu", value=value)
    weight = model[0].weight
    assert isinstance(weight, nn.Parameter) and not weight.requires_grad
    assert torch.equal(weight, value)
    set_module_tensor_to_device(model, "0.bias", "cpu", value=torch.ones(2, dtype=torch.float64))
    assert model[0].bias.dtype == torch.float32 and model[0].bias.requires_grad


def test_set_module_tensor_to_device_dtype_and_buffers() -> None:
    model = nn.BatchNorm1d(3)
    set_module_tensor_to_device(model, "weight", "cpu", value=torch.ones(3), dtype="float16")
    assert model.weight.dtype == torch.float16
    set_module_tensor_to_device(
        model, "num_batches_tracked", "cpu", value=torch.tensor(7), dtype=torch.float16
    )
    assert model.num_batches_tracked.dtype == torch.int64 and int(model.num_batches_tracked) == 7
    set_module_tensor_to_device(model, "running_mean", "meta")
    assert model.running_mean.is_meta and "running_mean" in model._buffers


def test_set_module_tensor_to_device_errors() -> None:
    with init_empty_weights():
        model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError) as info:
        set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.zeros(3, 3))
    # Accelerate's sentence, whole (its test compares the message with ==)
    assert str(info.value) == (
        'Trying to set a tensor of shape torch.Size([3, 3]) in "weight" (which has shape '
        "torch.Size([2, 3])), this looks incorrect."
    )
    with pytest.raises(ValueError, match="on the meta device .* pass `value=`"):
        set_module_tensor_to_device(model, "0.weight", "cpu")
    with pytest.raises(ValueError, match="no parameter or buffer named 'gamma'"):
        set_module_tensor_to_device(model, "0.gamma", "cpu", value=torch.zeros(1))
    with pytest.raises(ValueError, match="no submodule '7'"):
        set_module_tensor_to_device(model, "7.weight", "cpu", value=torch.zeros(1))


def test_set_module_tensor_to_device_reuses_tied_values_per_device() -> None:
    shared = torch.ones(2, 2)
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    tied_map: dict[int, dict[torch.device, torch.Tensor]] = {shared.data_ptr(): {}}
    set_module_tensor_to_device(first, "weight", "cpu", value=shared, tied_params_map=tied_map)
    set_module_tensor_to_device(second, "weight", "cpu", value=shared, tied_params_map=tied_map)
    assert second.weight is first.weight
    assert tied_map[shared.data_ptr()][torch.device("cpu")] is first.weight


def test_as_device_and_split_tensor_name() -> None:
    assert as_device("cpu") == torch.device("cpu")
    assert as_device(torch.device("meta")).type == "meta"
    if not torch.accelerator.is_available():
        with pytest.raises(ValueError, match="no accelerator"):
            as_device(0)
    with pytest.raises(ValueError, match="is not a device"):
        as_device("warp-drive")
    model = TinyLM()
    owner, local = split_tensor_name(model, "h.1.mlp.0.weight")
    assert owner is model.h[1].mlp[0] and local == "weight"


def test_named_module_tensors_and_non_persistent_buffers() -> None:
    model = nn.Sequential(nn.BatchNorm1d(2))
    model[0].register_buffer("scratch", torch.zeros(1), persistent=False)
    names = [n for n, _ in named_module_tensors(model, recurse=True)]
    assert names[:2] == ["0.weight", "0.bias"] and "0.scratch" in names
    kept = [n for n, _ in named_module_tensors(model, recurse=True, remove_non_persistent=True)]
    assert "0.scratch" not in kept and "0.running_mean" in kept
    assert [n for n, _ in named_module_tensors(model[0], include_buffers=False)] == [
        "weight",
        "bias",
    ]
    assert get_non_persistent_buffers(model, recurse=True, fqns=True) == {"0.scratch"}
    # Accelerate's names: the buffers' own (its test_get_non_persistent_buffers_*), a fresh set
    assert get_non_persistent_buffers(model, recurse=True) == {"scratch"}
    assert get_non_persistent_buffers(model[0]) == {"scratch"}
    assert get_non_persistent_buffers(model[0]) is not model[0]._non_persistent_buffers_set


def test_find_and_retie_parameters() -> None:
    model = TinyLM()
    assert find_tied_parameters(model) == [["lm_head.weight", "wte.weight"]]
    assert find_tied_parameters(nn.Linear(2, 2)) == []
    model.lm_head.weight = nn.Parameter(torch.zeros_like(model.wte.weight, device="meta"))
    assert model.lm_head.weight is not model.wte.weight
    retie_parameters(model, [["lm_head.weight", "wte.weight"]])
    assert model.lm_head.weight is model.wte.weight


def test_check_tied_parameters_on_same_device_warns() -> None:
    with pytest.warns(UserWarning, match="different devices"):
        check_tied_parameters_on_same_device([["a.w", "b.w"]], {"a": 0, "b": "cpu"})
    check_tied_parameters_on_same_device([["a.w", "b.w"]], {"": "cpu"})


def test_get_module_children_bottom_up() -> None:
    model = TinyLM(layers=2)
    order = get_module_children_bottom_up(model)
    assert order[-1] is model
    position = {id(m): i for i, m in enumerate(order)}
    for module in model.modules():
        for child in module.children():
            assert position[id(child)] < position[id(module)]
    named = get_module_children_bottom_up(model, return_fqns=True)
    assert named[-1] == ("", model)
    assert {n for n, _ in named} == {n for n, _ in model.named_modules()}

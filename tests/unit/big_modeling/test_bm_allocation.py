"""big_modeling.allocation and the tensor helpers Accelerate exports from utils.modeling."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.big_modeling.allocation import (
    clean_device_map,
    fallback_allocate,
    get_module_leaves,
    get_module_size_with_ties,
)
from hasten.big_modeling.sizes import compute_module_sizes, compute_module_total_buffer_size
from hasten.big_modeling.tensors import (
    check_device_same,
    check_tied_parameters_in_config,
    ensure_weights_retied,
    get_module_class_from_name,
)


def test_clean_device_map_merges_subtrees_on_one_device() -> None:
    device_map: dict[str, int | str | torch.device] = {
        "a.x": 0,
        "a.y": 0,
        "b.p": 1,
        "b.q.r": 1,
        "c.s": 0,
        "c.t": "cpu",
    }
    assert clean_device_map(device_map) == {"a": 0, "b": 1, "c.s": 0, "c.t": "cpu"}
    assert clean_device_map({"x": 0, "y": 0}) == {"": 0}


def test_module_leaves() -> None:
    sizes = {"": 10, "a": 6, "a.w": 4, "a.b": 2, "c": 4}
    assert get_module_leaves(sizes) == ["a.w", "a.b", "c"]


def _tied_model() -> nn.Module:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 10, bias=False))
    model[2].weight = model[0].weight
    return model


def test_module_size_with_ties_counts_the_tied_module() -> None:
    model = _tied_model()
    sizes = compute_module_sizes(model)
    treat = list(model.named_children())[1:]
    total, names, modules = get_module_size_with_ties(["2.weight"], sizes["0"], sizes, treat)
    assert total == sizes["0"] + sizes["2"] - sizes["2.weight"]
    assert names == ["2"] and modules == [model[2]]
    assert get_module_size_with_ties([], 7, sizes, treat) == (7, [], [])
    with pytest.raises(ValueError, match="belongs to none of the modules"):
        get_module_size_with_ties(["9.weight"], 1, sizes, treat)


def test_fallback_allocate_finds_the_first_piece_that_fits() -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.Sequential(nn.Linear(10, 2), nn.Linear(2, 2)))
    sizes = compute_module_sizes(model)
    modules = list(model.named_children())
    # breadth first: "0" is split into its parameters, and its bias is the first piece to fit
    name, module, rest = fallback_allocate(modules, sizes, sizes["1.0"])
    assert name == "0.bias" and module is model[0].bias
    assert [n for n, _ in rest] == ["0.weight", "1"]
    name, module, rest = fallback_allocate(
        modules, sizes, sizes["1.0"], no_split_module_classes=["Linear"]
    )
    assert name == "1.0" and module is model[1][0]
    assert [n for n, _ in rest] == ["0", "1.1"]
    assert fallback_allocate(modules, sizes, 1) == (None, None, modules)
    assert fallback_allocate(modules, sizes, "not a size") == (None, None, modules)


def test_buffer_size() -> None:
    model = nn.BatchNorm1d(8)
    expected = sum(b.numel() * b.element_size() for b in model.buffers())
    assert compute_module_total_buffer_size(model) == expected
    assert compute_module_total_buffer_size(nn.Linear(2, 2)) == 0


def test_check_device_same_treats_no_index_as_zero() -> None:
    assert check_device_same(torch.device("cuda"), torch.device("cuda:0"))
    assert not check_device_same(torch.device("cuda:1"), torch.device("cuda"))
    assert check_device_same(torch.device("cpu"), torch.device("cpu"))
    assert not check_device_same(torch.device("cpu"), torch.device("meta"))


def test_check_tied_parameters_in_config_reads_transformers_flags() -> None:
    class Config:
        tie_word_embeddings = True
        is_encoder_decoder = False

    class PreTrainedModel(nn.Module):
        def __init__(self, config: object) -> None:
            super().__init__()
            self.config = config
            self.head = nn.Linear(2, 2)

        def get_output_embeddings(self) -> nn.Module:
            return self.head

    assert check_tied_parameters_in_config(PreTrainedModel(Config()))
    Config.tie_word_embeddings = False
    assert not check_tied_parameters_in_config(PreTrainedModel(Config()))
    assert not check_tied_parameters_in_config(_tied_model())  # not a transformers model


def test_ensure_weights_retied_keeps_ties_through_a_reallocating_init() -> None:
    model = _tied_model()
    model._tied_weights_keys = ["2.weight"]  # type: ignore[assignment]

    def reinit(module: nn.Module) -> nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, nn.Parameter(torch.ones_like(param)))
        return module

    wrapped = ensure_weights_retied(reinit, model, torch.device("cpu"))
    for module in model.children():
        wrapped(module)
    assert model[0].weight is model[2].weight
    plain = nn.Linear(2, 2)
    assert ensure_weights_retied(reinit, plain, torch.device("cpu")) is reinit


def test_get_module_class_from_name() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))
    assert get_module_class_from_name(model, "ReLU") is nn.ReLU
    assert get_module_class_from_name(model, "Sequential") is nn.Sequential
    assert get_module_class_from_name(model, "Conv2d") is None

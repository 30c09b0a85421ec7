"""Offload folders: raw .dat files + index.json, read back memory-mapped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from hasten.big_modeling.init import init_empty_weights
from hasten.big_modeling.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    load_offloaded_weights,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from hasten.core.safetensors_format import read_safetensors_header
from unit.big_modeling.bm_models import TinyLM


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 4),
        torch.randn(5).to(torch.bfloat16),
        torch.arange(7, dtype=torch.int64),
        torch.tensor(3.5),
        torch.zeros(0, 3),
        torch.randn(4).to(torch.float8_e4m3fn),
        torch.tensor([True, False]),
    ],
)
def test_offload_weight_round_trip_is_exact(tmp_path: Path, tensor: torch.Tensor) -> None:
    index: dict = {}
    offload_weight(tensor, "w", tmp_path, index=index)
    assert index["w"] == {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
    }
    back = load_offloaded_weight(tmp_path / "w.dat", index["w"])
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    flat_back, flat_want = back.reshape(-1), tensor.reshape(-1)
    # bitwise comparison: float8 has no equality kernel
    assert torch.equal(flat_back.view(torch.uint8), flat_want.view(torch.uint8))


def test_offload_state_dict_and_loader(tmp_path: Path) -> None:
    state = {"a.weight": torch.randn(2, 2), "b.bias": torch.randn(3)}
    offload_state_dict(tmp_path / "off", state)
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert set(index) == set(state)
    loader = OffloadedWeightsLoader(save_folder=tmp_path / "off", state_dict={"c": torch.ones(1)})
    assert sorted(loader) == ["a.weight", "b.bias", "c"] and len(loader) == 3
    assert torch.equal(loader["a.weight"], state["a.weight"]) and "c" in loader
    with pytest.raises(ValueError, match="needs a state_dict, a save_folder or an index"):
        OffloadedWeightsLoader()


def test_save_offload_index_merges(tmp_path: Path) -> None:
    save_offload_index({"a": {"dtype": "float32", "shape": [1]}}, tmp_path)
    save_offload_index({"b": {"dtype": "int64", "shape": [2]}}, tmp_path)
    save_offload_index({}, tmp_path)
    assert set(json.loads((tmp_path / "index.json").read_text())) == {"a", "b"}


def test_loader_reads_safetensors_entries_in_place(tmp_path: Path) -> None:
    tensor = torch.randn(3, 3)
    save_file({"x": tensor, "y": torch.arange(4)}, tmp_path / "m.safetensors")
    start, header = read_safetensors_header(tmp_path / "m.safetensors")
    assert start > 8 and set(header) == {"x", "y"}
    index = {
        "layer.x": {
            "safetensors_file": str(tmp_path / "m.safetensors"),
            "weight_name": "x",
            "dtype": "float16",
        },
        "layer.y": {"safetensors_file": str(tmp_path / "m.safetensors"), "weight_name": "y"},
    }
    loader = OffloadedWeightsLoader(index=index)
    assert torch.equal(loader["layer.x"], tensor.half())
    assert torch.equal(loader["layer.y"], torch.arange(4))


def test_prefixed_dataset() -> None:
    data = {"h.1.w": 1, "h.1.b": 2, "h.10.w": 3}
    view = PrefixedDataset(data, "h.1.")
    assert view["w"] == 1 and "b" in view and "x" not in view
    assert sorted(view) == ["b", "w"] and len(view) == 2


def test_extract_submodules_state_dict_does_not_confuse_siblings() -> None:
    state = {f"h.{i}.{p}": torch.zeros(1) for i in (1, 10) for p in ("w", "b")} | {
        "h.1": torch.ones(1)
    }
    assert set(extract_submodules_state_dict(state, ["h.1"])) == {"h.1", "h.1.w", "h.1.b"}
    assert set(extract_submodules_state_dict(state, [""])) == set(state)


def test_load_offloaded_weights_into_a_meta_model(tmp_path: Path) -> None:
    source = TinyLM()
    offload_state_dict(tmp_path, source.state_dict())
    with init_empty_weights():
        model = TinyLM()
    index = json.loads((tmp_path / "index.json").read_text())
    load_offloaded_weights(model, index, tmp_path)
    load_offloaded_weights(model, {}, tmp_path)
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert isinstance(model.h[0].attn.weight, nn.Parameter)

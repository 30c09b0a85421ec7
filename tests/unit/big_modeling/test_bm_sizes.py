"""Sizes: unit parsing, dtype widths, per-module sizes, largest layer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.big_modeling.sizes import (
    ModuleTree,
    calculate_maximum_sizes,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    get_max_layer_size,
    resolve_dtype,
)
from hasten.config.enums import CustomDtype
from unit.big_modeling.bm_models import Block, TinyLM


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1GiB", 2**30),
        ("1.5MiB", int(1.5 * 2**20)),
        ("2KiB", 2048),
        ("10GB", 10 * 10**9),
        ("500MB", 500 * 10**6),
        ("3KB", 3000),
        ("8Gb", 10**9),
        ("123", 123),
        (42, 42),
    ],
)
def test_convert_file_size_to_int(text: str | int, expected: int) -> None:
    assert convert_file_size_to_int(text) == expected


@pytest.mark.parametrize("bad", ["ten GB", "5XB", "-1GB", ""])
def test_convert_file_size_to_int_rejects_bad_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="not in a valid format"):
        convert_file_size_to_int(bad)


def test_convert_file_size_to_int_rejects_types_and_negatives() -> None:
    with pytest.raises(TypeError, match="int or a string"):
        convert_file_size_to_int(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        convert_file_size_to_int(-3)


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        (torch.float32, 4),
        (torch.bfloat16, 2),
        (torch.int64, 8),
        (torch.uint8, 1),
        (torch.bool, 1 / 8),
        (torch.float8_e4m3fn, 1),
        (CustomDtype.INT4, 1 / 2),
        (CustomDtype.INT2, 1 / 4),
        (CustomDtype.FP8, 1),
    ],
)
def test_dtype_byte_size(dtype: torch.dtype, size: float) -> None:
    assert dtype_byte_size(dtype) == size


def test_resolve_dtype_accepts_names_and_rejects_others() -> None:
    assert resolve_dtype("float16") is torch.float16
    assert resolve_dtype("torch.bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="not a torch dtype"):
        resolve_dtype("float17")


def _manual_sizes(model: nn.Module) -> dict[str, int]:
    sizes: dict[str, int] = {}
    seen = set()
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, tensor in tensors:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        size = tensor.numel() * tensor.element_size()
        parts = name.split(".")
        for cut in range(len(parts) + 1):
            key = ".".join(parts[:cut])
            sizes[key] = sizes.get(key, 0) + size
    return sizes


def test_compute_module_sizes_matches_a_manual_sum_and_counts_tied_weights_once() -> None:
    model = TinyLM()
    sizes = compute_module_sizes(model)
    expected = _manual_sizes(model)
    for name, size in expected.items():
        assert sizes[name] == size, name
    assert sizes["lm_head"] == 0  # the tied weight is counted under wte
    assert sizes[""] == sum(p.numel() * 4 for p in model.parameters()) + 4


def test_compute_module_sizes_dtype_casts_floats_only_and_never_upcasts() -> None:
    model = nn.Module()
    model.lin = nn.Linear(4, 4)
    model.register_buffer("steps", torch.zeros(10, dtype=torch.int64))
    model.half_lin = nn.Linear(2, 2).half()
    sizes = compute_module_sizes(model, dtype=torch.float16)
    assert sizes["lin"] == (16 + 4) * 2
    assert sizes["steps"] == 80
    sizes32 = compute_module_sizes(model, dtype="float32")
    assert sizes32["half_lin"] == 6 * 2


def test_compute_module_sizes_special_dtypes_and_buffers_only() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    sizes = compute_module_sizes(model, special_dtypes={"0.weight": torch.int8})
    assert sizes["0.weight"] == 16
    assert sizes["0"] == 16 + 16
    buffers = compute_module_sizes(model, buffers_only=True)
    assert buffers[""] == 4 * 4 + 4 * 4 + 8  # running mean/var + num_batches_tracked
    assert "0.weight" not in buffers


def test_module_tree_collapses_no_split_modules_but_keeps_their_size() -> None:
    model = TinyLM()
    flat = ModuleTree(model)
    collapsed = ModuleTree(model, no_split_module_classes=["Block"])
    assert collapsed.size[0] == flat.size[0]
    block_nodes = [i for i, m in enumerate(collapsed.modules) if isinstance(m, Block)]
    assert len(block_nodes) == 4
    assert all(collapsed.end[i] == i + 1 and collapsed.is_layer(i) for i in block_nodes)
    assert collapsed.tied == [["lm_head.weight", "wte.weight"]]
    assert collapsed.node("h.2") is not None
    assert collapsed.holder("h.2.mlp.0.weight") == collapsed.node("h.2")


def _leaf_max(
    model: nn.Module, sizes: dict[str, int], no_split: tuple[str, ...]
) -> tuple[int, list[str]]:
    layers = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(f"{n}.") for n, _ in layers):
            continue
        if type(module).__name__ in no_split or not list(module.children()):
            layers.append((name, module))
    best = max(sizes[n] for n, _ in layers)
    return best, [n for n, _ in layers if sizes[n] == best]


def test_get_max_layer_size_respects_no_split_classes() -> None:
    model = TinyLM()
    sizes = compute_module_sizes(model)
    modules = list(model.named_children())
    assert get_max_layer_size(modules, sizes, []) == _leaf_max(model, sizes, ())
    size, names = get_max_layer_size(modules, sizes, ["Block"])
    assert (size, names) == _leaf_max(model, sizes, ("Block",))
    assert names == ["h.0", "h.1", "h.2", "h.3"]


def test_calculate_maximum_sizes_reads_transformers_no_split_attribute() -> None:
    model = TinyLM()
    total, largest = calculate_maximum_sizes(model)
    sizes = compute_module_sizes(model)
    assert total == sizes[""]
    assert largest == _leaf_max(model, sizes, ())
    model._no_split_modules = ["Block"]
    _, largest = calculate_maximum_sizes(model)
    assert largest == (sizes["h.0"], ["h.0", "h.1", "h.2", "h.3"])

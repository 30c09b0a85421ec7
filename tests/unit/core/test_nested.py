"""Unit tests for hasten.core.nested: structure walking, moving, slicing and measuring."""

from __future__ import annotations

import pickle
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch

from hasten.core.nested import (
    ConvertOutputsToFp32,
    TensorInformation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    get_data_structure,
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    listify,
    rebuild_mapping,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

Point = namedtuple("Point", ["x", "y"])


class FrozenMapping(Mapping):
    """A read-only Mapping subclass built from a dict (like transformers' BatchEncoding)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class NoDictMapping(FrozenMapping):
    def __init__(self) -> None:  # cannot be rebuilt from a dict
        super().__init__({})


class Movable:
    def __init__(self) -> None:
        self.moved_to: Any = None

    def to(self, device: Any) -> Movable:  # no non_blocking keyword on purpose
        self.moved_to = device
        return self


class Module(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": x.half() * 2, "idx": torch.arange(2)}


def test_predicates() -> None:
    assert is_torch_tensor(torch.zeros(1))
    assert not is_torch_tensor([1.0])
    assert is_tensor_information(TensorInformation(torch.Size([2]), torch.float32))
    assert not is_tensor_information(torch.zeros(2))
    assert is_namedtuple(Point(1, 2))
    assert not is_namedtuple((1, 2))


def test_honor_type_keeps_list_tuple_namedtuple() -> None:
    assert honor_type([0], (i for i in range(3))) == [0, 1, 2]
    assert honor_type((0,), (i for i in range(2))) == (0, 1)
    p = honor_type(Point(0, 0), (v for v in (5, 6)))
    assert isinstance(p, Point)
    assert p == Point(5, 6)


def test_rebuild_mapping_types() -> None:
    assert type(rebuild_mapping(OrderedDict(a=1), {"a": 2})) is OrderedDict
    dd = rebuild_mapping(defaultdict(list, a=1), {"a": 2})
    assert isinstance(dd, defaultdict)
    assert dd.default_factory is list
    assert dd["a"] == 2
    assert type(rebuild_mapping(FrozenMapping({}), {"a": 1})) is FrozenMapping
    assert rebuild_mapping(NoDictMapping(), {"a": 1}) == {"a": 1}


def test_recursively_apply_keeps_types_and_passes_args() -> None:
    data = {
        "a": [torch.ones(2), (torch.ones(1), "text")],
        "p": Point(torch.zeros(1), 3),
        "m": FrozenMapping({"t": torch.ones(1)}),
    }
    out = recursively_apply(lambda t, k, scale=1: t * k * scale, data, 2, scale=3)
    assert torch.equal(out["a"][0], torch.full((2,), 6.0))
    assert isinstance(out["a"][1], tuple)
    assert out["a"][1][1] == "text"
    assert isinstance(out["p"], Point)
    assert out["p"].y == 3
    assert isinstance(out["m"], FrozenMapping)
    assert torch.equal(out["m"]["t"], torch.full((1,), 6.0))


def test_recursively_apply_fast_path_and_custom_test_type() -> None:
    assert torch.equal(recursively_apply(lambda t: t + 1, torch.zeros(2)), torch.ones(2))
    out = recursively_apply(lambda x: x * 10, [1, "a", 2.5], test_type=lambda x: isinstance(x, int))
    assert out == [10, "a", 2.5]


def test_recursively_apply_error_on_other_type() -> None:
    def double(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    with pytest.raises(
        TypeError,
        match=r"^Unsupported types \(<class 'str'>\) passed to `double`\. Only nested list/tuple/dicts of objects that are valid for `is_torch_tensor` should be passed\.$",
    ):
        recursively_apply(double, [torch.ones(1), "x"], error_on_other_type=True)


def test_send_to_device_structures_and_skip_keys() -> None:
    meta = torch.device("meta")
    data = {"a": torch.ones(2), "b": [torch.ones(1)], "keep": torch.ones(1), "n": 3}
    out = send_to_device(data, meta, skip_keys="keep")
    assert out["a"].device == meta
    assert out["b"][0].device == meta
    assert out["keep"].device.type == "cpu"
    assert out["n"] == 3
    out = send_to_device(data, meta, skip_keys=["keep", "a"])
    assert out["a"].device.type == "cpu"
    assert out["b"][0].device == meta
    assert send_to_device(torch.ones(1), meta).device == meta
    p = send_to_device(Point(torch.ones(1), torch.ones(1)), meta, non_blocking=True)
    assert isinstance(p, Point)
    assert p.x.device == meta


def test_send_to_device_plain_dict_with_mixed_values() -> None:
    meta = torch.device("meta")
    param = torch.nn.Parameter(torch.ones(2))
    data = {
        "t": torch.ones(2),
        "p": param,
        "seq": (torch.ones(1), "s"),
        "obj": Movable(),
        "n": None,
    }
    out = send_to_device(data, meta)
    assert type(out) is dict and list(out) == ["t", "p", "seq", "obj", "n"]
    assert out["t"].device == meta and out["p"].device == meta
    assert isinstance(out["seq"], tuple) and out["seq"][0].device == meta and out["seq"][1] == "s"
    assert out["obj"].moved_to == meta and out["n"] is None
    assert data["t"].device.type == "cpu"  # the input dict is not modified


def test_send_to_device_objects_with_to() -> None:
    obj = Movable()
    assert send_to_device([obj], "meta")[0].moved_to == "meta"


def test_send_to_device_batch_encoding() -> None:
    transformers = pytest.importorskip("transformers", reason="BatchEncoding check")

    def batch() -> Any:
        return transformers.BatchEncoding({"ids": torch.ones(2), "mask": torch.ones(2)})

    moved = send_to_device(batch(), "meta")
    assert type(moved).__name__ == "BatchEncoding"
    assert moved["ids"].device.type == "meta"
    kept = send_to_device(batch(), "meta", skip_keys="mask")
    assert type(kept).__name__ == "BatchEncoding"
    assert kept["mask"].device.type == "cpu"
    assert kept["ids"].device.type == "meta"


def test_data_structure_round_trip() -> None:
    data = {"x": torch.ones(2, 3), "y": [torch.zeros(4, dtype=torch.long)]}
    info = get_data_structure(data)
    assert info["x"] == TensorInformation(torch.Size([2, 3]), torch.float32)
    assert get_shape(data) == {"x": [2, 3], "y": [[4]]}
    fresh = initialize_tensors(info)
    assert fresh["x"].shape == (2, 3)
    assert fresh["y"][0].dtype == torch.long


def test_find_batch_size() -> None:
    assert find_batch_size(torch.zeros(5, 2)) == 5
    assert find_batch_size({"a": [torch.zeros(3)], "b": torch.zeros(7)}) == 3
    assert find_batch_size((Point(torch.zeros(4), 1),)) == 4
    with pytest.raises(ValueError, match="empty list"):
        find_batch_size([])
    with pytest.raises(TypeError, match="Can only find the batch size of tensors, got str"):
        find_batch_size({"a": "text"})
    assert ignorant_find_batch_size({"a": "text"}) is None
    assert ignorant_find_batch_size([torch.zeros(2)]) == 2


def test_find_device() -> None:
    assert find_device({"a": 1, "b": [torch.zeros(1, device="meta")]}) == torch.device("meta")
    assert find_device([1, "x"]) is None
    assert find_device(torch.zeros(1)).type == "cpu"


def test_listify() -> None:
    data = {"a": torch.tensor([1, 2]), "b": (torch.tensor(1.5, dtype=torch.bfloat16),)}
    assert listify(data) == {"a": [1, 2], "b": (1.5,)}


def test_slice_tensors() -> None:
    data = [torch.arange(6), {"k": torch.arange(6) * 2, "s": "keep"}]
    out = slice_tensors(data, slice(1, 3), process_index=0, num_processes=2)
    assert out[0].tolist() == [1, 2]
    assert out[1]["k"].tolist() == [2, 4]
    assert out[1]["s"] == "keep"


def test_concatenate() -> None:
    batches = [{"x": torch.ones(2, 2), "p": Point(torch.zeros(1), torch.ones(1))} for _ in range(3)]
    out = concatenate(batches)
    assert out["x"].shape == (6, 2)
    assert isinstance(out["p"], Point)
    assert out["p"].y.shape == (3,)
    assert concatenate([torch.ones(2, 1), torch.ones(2, 1)], dim=1).shape == (2, 2)
    assert concatenate([5]) == 5
    with pytest.raises(TypeError, match="Can only concatenate tensors.*got str"):
        concatenate(["a", "b"])


def test_convert_to_fp32() -> None:
    data = {"h": torch.ones(2, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)]}
    data["i"] = torch.ones(1, dtype=torch.long)
    out = convert_to_fp32(data)
    assert out["h"].dtype == torch.float32
    assert out["b"][0].dtype == torch.float32
    assert out["i"].dtype == torch.long
    assert convert_to_fp32(torch.ones(1, dtype=torch.float16)).dtype == torch.float32
    same = torch.ones(1, dtype=torch.float64)
    assert convert_to_fp32(same) is same


def test_convert_outputs_to_fp32_is_picklable_and_unwrappable() -> None:
    model = Module()
    model.forward = convert_outputs_to_fp32(model.forward)
    assert isinstance(model.forward, ConvertOutputsToFp32)
    out = model(torch.ones(2))
    assert out["out"].dtype == torch.float32
    assert out["idx"].dtype == torch.long
    assert model.forward.__wrapped__ == Module.forward.__get__(model)
    clone = pickle.loads(pickle.dumps(model))
    assert clone(torch.ones(2))["out"].dtype == torch.float32
    wrapper = pickle.loads(pickle.dumps(convert_outputs_to_fp32(torch.Tensor.half)))
    assert wrapper(torch.ones(1)).dtype == torch.float32


def test_convert_outputs_to_fp32_bound_as_method() -> None:
    from types import MethodType

    model = Module()
    model.forward = MethodType(convert_outputs_to_fp32(Module.forward), model)
    assert model(torch.ones(2))["out"].dtype == torch.float32
    assert model.forward.__func__.__wrapped__ is Module.forward
    clone = pickle.loads(pickle.dumps(model))
    assert torch.equal(clone(torch.ones(2))["out"].float(), torch.full((2,), 2.0))

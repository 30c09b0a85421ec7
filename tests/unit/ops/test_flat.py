"""Unit tests for hasten.ops.flat: leaf listing, rebuilding and bucketing."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch

from hasten.ops.flat import buckets, flatten

Pair = namedtuple("Pair", ["a", "b"])


def test_flatten_tensor_and_flat_dict() -> None:
    t = torch.ones(2)
    leaves, rebuild = flatten(t, "op")
    assert leaves == [t]
    assert rebuild(["x"]) == "x"
    leaves, rebuild = flatten({"a": t, "b": t * 2}, "op")
    assert len(leaves) == 2
    assert rebuild([1, 2]) == {"a": 1, "b": 2}


def test_flatten_nested_rebuilds_types_in_order() -> None:
    data = OrderedDict(p=Pair(torch.ones(1), [torch.zeros(1)]), q=(torch.ones(2),))
    leaves, rebuild = flatten(data, "op")
    assert [leaf.shape[0] for leaf in leaves] == [1, 1, 2]
    out = rebuild(["a", "b", "c"])
    assert isinstance(out, OrderedDict)
    assert out["p"] == Pair("a", ["b"])
    assert out["q"] == ("c",)


def test_flatten_rejects_other_leaves_with_path() -> None:
    with pytest.raises(
        TypeError, match=r"`my_op` only works on tensors.*int \(3\) at \['x'\]\[0\]\. Hint"
    ):
        flatten({"x": [3, torch.ones(1)]}, "my_op", "Hint")
    with pytest.raises(TypeError, match=r"got str \('a'\)\. Convert"):
        flatten("a", "op")


def test_buckets_group_by_dtype_and_cap() -> None:
    f, i = torch.ones(3), torch.ones(3, dtype=torch.long)
    assert buckets([f]) == [[0]]
    assert buckets([f, i, f, i]) == [[0, 2], [1, 3]]
    assert buckets([f, f, f], limit=7) == [[0, 1], [2]]
    assert buckets([torch.ones(10), f], limit=8) == [[0], [1]]

"""split_inputs: contiguous shares for every supported input type, with and without padding."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest
import torch

from hasten.state.split import share_bounds, split_inputs


def all_shares(inputs: object, num: int, pad: bool = False) -> list[object]:
    return [split_inputs(inputs, index, num, pad) for index in range(num)]


@pytest.mark.parametrize("length", range(0, 9))
@pytest.mark.parametrize("num", [1, 2, 3, 4])
def test_shares_cover_the_input_in_order(length: int, num: int) -> None:
    items = list(range(length))
    shares = all_shares(items, num)
    assert sum(shares, []) == items  # type: ignore[arg-type]
    sizes = [len(share) for share in shares]  # type: ignore[arg-type]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    padded = all_shares(items, num, pad=True)
    if length:
        assert {len(share) for share in padded} == {max(sizes)}  # type: ignore[arg-type]
        for share, plain in zip(padded, shares):
            assert share[: len(plain)] == plain  # type: ignore[index]
            assert all(x == items[-1] for x in share[len(plain) :])  # type: ignore[index]


def test_share_bounds() -> None:
    assert [share_bounds(5, i, 2) for i in range(2)] == [(0, 3, 3), (3, 5, 3)]
    assert share_bounds(4, 1, 2) == (2, 4, 2)


def test_list_and_tuple_keep_their_type() -> None:
    assert all_shares(["a", "b", "c"], 2, pad=True) == [["a", "b"], ["c", "c"]]
    assert all_shares(("a", "b", "c"), 2) == [("a", "b"), ("c",)]
    assert all_shares(("a", "b", "c"), 2, pad=True) == [("a", "b"), ("c", "c")]


def test_tuple_subclasses_split_like_slices() -> None:
    pair = namedtuple("pair", ["first", "second"])  # noqa: PYI024 - a plain namedtuple on purpose
    assert all_shares(pair("x", "y"), 2) == [("x",), ("y",)]
    assert type(split_inputs(pair("x", "y"), 0, 2)) is tuple
    assert all_shares(pair("x", "y"), 3, pad=True) == [("x",), ("y",), ("y",)]


def test_defaultdict_keeps_its_factory() -> None:
    data = defaultdict(list, {"ids": [1, 2, 3]})
    share = split_inputs(data, 0, 2)
    assert isinstance(share, defaultdict) and share == {"ids": [1, 2]}
    assert share["missing"] == []


def test_tensor_split_and_padding() -> None:
    data = torch.arange(10).reshape(5, 2)
    first, second = all_shares(data, 2, pad=True)
    assert torch.equal(first, data[:3])  # type: ignore[arg-type]
    assert torch.equal(second, torch.tensor([[6, 7], [8, 9], [8, 9]]))  # type: ignore[arg-type]
    assert torch.equal(split_inputs(data, 1, 2), data[3:])


def test_numpy_split_and_padding() -> None:
    data = np.arange(5)
    assert split_inputs(data, 1, 2, True).tolist() == [3, 4, 4]
    assert split_inputs(data, 1, 2).tolist() == [3, 4]


def test_dict_values_are_split_alike_and_input_is_not_mutated() -> None:
    data = {"ids": [1, 2, 3], "mask": torch.tensor([1, 0, 1]), "nested": {"x": (7, 8, 9)}}
    share = split_inputs(data, 1, 2, True)
    assert share["ids"] == [3, 3] and share["mask"].tolist() == [1, 1]
    assert share["nested"] == {"x": (9, 9)}
    assert data["ids"] == [1, 2, 3]
    ordered = split_inputs(OrderedDict(a=[1, 2]), 0, 2)
    assert isinstance(ordered, OrderedDict) and ordered == {"a": [1]}


def test_fewer_items_than_processes() -> None:
    assert all_shares([1], 3) == [[1], [], []]
    assert all_shares([1], 3, pad=True) == [[1], [1], [1]]
    assert all_shares([], 2, pad=True) == [[], []]


def test_dataset_like_objects_are_selected() -> None:
    class Dataset:
        def __init__(self, rows: list[int]) -> None:
            self.rows = rows

        def __len__(self) -> int:
            return len(self.rows)

        def select(self, indices: list[int]) -> list[int]:
            return [self.rows[i] for i in indices]

    assert split_inputs(Dataset([5, 6, 7]), 1, 2, True) == [7, 7]
    assert split_inputs(Dataset([5, 6, 7]), 0, 2) == [5, 6]


def test_strings_are_sequences() -> None:
    assert all_shares("abc", 2) == ["ab", "c"]


def test_dict_with_unequal_lengths_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"same length; got lengths \{'a': 2, 'b': 3\}"):
        split_inputs({"a": [1, 2], "b": [1, 2, 3]}, 0, 2)


def test_unsplittable_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="cannot split a int"):
        split_inputs(5, 0, 2)
    with pytest.raises(TypeError, match="cannot split a set"):
        split_inputs({1, 2}, 0, 2)

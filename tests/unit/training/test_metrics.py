from __future__ import annotations

from dataclasses import dataclass

import torch

from hasten.training.metrics import gather_for_metrics, is_all_tensors


@dataclass
class FakeState:
    end_of_dataloader: bool
    remainder: int


def test_is_all_tensors() -> None:
    t = torch.ones(1)
    assert is_all_tensors(t)
    assert is_all_tensors({"a": [t, (t,)]})
    assert not is_all_tensors([t, "x"])
    assert not is_all_tensors(3)


def test_truncates_only_at_end_with_remainder() -> None:
    data = {"x": torch.arange(8), "y": torch.arange(8) * 2}
    out = gather_for_metrics(data, gradient_state=FakeState(True, 5))
    assert out["x"].tolist() == [0, 1, 2, 3, 4]
    assert out["y"].tolist() == [0, 2, 4, 6, 8]
    middle = gather_for_metrics(data, gradient_state=FakeState(False, 5))
    assert middle["x"].shape == (8,)
    unknown = gather_for_metrics(data, gradient_state=FakeState(True, -1))
    assert unknown["x"].shape == (8,)
    full = gather_for_metrics(data, gradient_state=FakeState(True, 0))
    assert full["x"].shape == (8,)


def test_uncuttable_leaves_return_everything_as_gathered() -> None:
    # Accelerate: a 0-d leaf (or an object without slicing) makes the cut fail -> data unchanged.
    data = {"loss": torch.tensor(2.0), "x": torch.arange(4)}
    out = gather_for_metrics(data, gradient_state=FakeState(True, 1))
    assert out["loss"].shape == () and out["x"].shape == (4,)
    obj = gather_for_metrics({"k": 1}, gradient_state=FakeState(True, 1))
    assert obj == {"k": 1}


def test_objects_are_gathered_and_truncated_as_a_list() -> None:
    out = gather_for_metrics(["a", "b", "c"], gradient_state=FakeState(True, 2))
    assert out == ["a", "b"]
    forced = gather_for_metrics(
        [torch.ones(1)], use_gather_object=True, gradient_state=FakeState(False, 0)
    )
    assert isinstance(forced, list)

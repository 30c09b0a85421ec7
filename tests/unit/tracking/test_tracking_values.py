from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from hasten.tracking.values import SkipWarner, flatten_dict, to_hparam, to_scalar


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, 3),
        (2.5, 2.5),
        (True, 1),
        (np.float32(1.5), 1.5),
        (np.int64(7), 7),
        (np.array(4.0), 4.0),
        (torch.tensor(0.25), 0.25),
        (torch.tensor([9]), 9),
    ],
)
def test_to_scalar_accepts_single_numbers(value: object, expected: float) -> None:
    out = to_scalar(value)
    assert out == expected
    assert type(out) in (int, float)


@pytest.mark.parametrize(
    "value", ["text", [1, 2], {"a": 1}, torch.ones(2), np.ones(3), None, 1 + 2j, torch.tensor(1j)]
)
def test_to_scalar_rejects_everything_else(value: object) -> None:
    assert to_scalar(value) is None


def test_flatten_dict_joins_nested_keys() -> None:
    nested = {"lr": 0.1, "opt": {"name": "adam", "betas": {"b1": 0.9}}, "n": None}
    assert flatten_dict(nested) == {"lr": 0.1, "opt/name": "adam", "opt/betas/b1": 0.9, "n": None}
    assert flatten_dict(nested, sep=".")["opt.betas.b1"] == 0.9


def test_to_hparam_keeps_simple_types_and_stringifies_others() -> None:
    assert to_hparam(True) is True
    assert to_hparam("adam") == "adam"
    assert to_hparam(torch.tensor(2.0)) == 2.0
    assert to_hparam([1, 2]) == "[1, 2]"
    assert to_hparam(None) == "None"
    assert to_hparam(torch.float16) == "torch.float16"


def test_skip_warner_warns_once_per_key_and_names_it() -> None:
    warner = SkipWarner("demo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            warner.skip("hist", [1, 2])
    (only,) = caught
    assert "demo tracker skipped 'hist': got a list" in str(only.message)
    with pytest.warns(UserWarning, match="'other'"):
        warner.skip("other", object())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warner.skip("hist", [3])  # already warned: silent


def test_skip_warning_points_at_the_callers_line() -> None:
    warner = SkipWarner("demo")
    with pytest.warns(UserWarning, match="skipped 'k'") as caught:
        warner.skip("k", [1])
    assert caught[0].filename == __file__

"""core.versions: compare_versions and is_torch_version."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from hasten.core.versions import (
    STR_OPERATION_TO_FUNC,
    compare_versions,
    is_torch_version,
    torch_version,
)


@pytest.mark.parametrize(
    ("left", "op", "right", "expected"),
    [
        ("2.10", ">", "2.9", True),  # numeric, not lexical
        ("1.0.0", "==", "1.0", True),
        ("1.0", "!=", "1.0", False),
        ("2.0rc1", "<", "2.0", True),
        ("3", ">=", "3.0", True),
        ("3", "<=", "2.99", False),
    ],
)
def test_compare_version_strings(left: str, op: str, right: str, expected: bool) -> None:
    assert compare_versions(left, op, right) is expected


def test_compare_installed_library() -> None:
    numpy_version = importlib.metadata.version("numpy")
    assert compare_versions("numpy", "==", numpy_version) is True
    assert compare_versions("numpy", "<", "999") is True


def test_compare_unknown_library_raises() -> None:
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        compare_versions("hasten-no-such-dist", ">", "1.0")


def test_unknown_operation_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown comparison '=>'.*'>='"):
        compare_versions("1.0", "=>", "1.0")
    with pytest.raises(ValueError, match="unknown comparison"):
        is_torch_version("~=", "2.0")


def test_invalid_requirement_version() -> None:
    with pytest.raises(ValueError, match=r"'not.a.version!' is not a valid version"):
        compare_versions("1.0", ">", "not.a.version!")


def test_is_torch_version_ignores_local_tag() -> None:
    base = torch.__version__.split("+")[0]
    assert torch_version() == base
    assert is_torch_version("==", base) is True
    assert is_torch_version(">=", "2.4") is True
    assert is_torch_version("<", "2.4") is False


def test_operation_table_is_complete() -> None:
    assert sorted(STR_OPERATION_TO_FUNC) == sorted([">", ">=", "==", "!=", "<=", "<"])

"""Version comparisons for installed packages and for torch itself."""

from __future__ import annotations

import functools
import importlib.metadata
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packaging.version import Version

__all__ = ["STR_OPERATION_TO_FUNC", "compare_versions", "is_torch_version", "torch_version"]

STR_OPERATION_TO_FUNC: dict[str, Callable[[Any, Any], Any]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


@functools.cache
def _parse(version: str) -> Version:
    from packaging.version import InvalidVersion, Version  # imported late: saves import time

    try:
        return Version(version)
    except InvalidVersion:
        raise ValueError(
            f"{version!r} is not a valid version string; pass something like '2.4.0'"
        ) from None


def _operation(operation: str) -> Callable[[Any, Any], Any]:
    func = STR_OPERATION_TO_FUNC.get(operation)
    if func is None:
        raise ValueError(
            f"unknown comparison {operation!r}; use one of {list(STR_OPERATION_TO_FUNC)}"
        )
    return func


@functools.cache
def torch_version() -> str:
    """Return the installed torch version without its local build tag (e.g. '2.13.0')."""
    import torch

    return str(_parse(torch.__version__).base_version)


def compare_versions(library_or_version: str, operation: str, requirement_version: str) -> bool:
    """Compare a library's installed version (or a version string) with a requirement.

    Args:
        library_or_version: an installed distribution name (e.g. "numpy") or a version string.
        operation: one of ">", ">=", "==", "!=", "<=", "<".
        requirement_version: the version to compare against.

    Raises:
        ValueError: unknown operation or invalid version string.
        importlib.metadata.PackageNotFoundError: the library is not installed.
    """
    func = _operation(operation)
    try:
        current = _parse(library_or_version)
    except ValueError:
        current = _parse(importlib.metadata.version(library_or_version))
    return bool(func(current, _parse(requirement_version)))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch version (build tag ignored) with `version` using `operation`.

    Example:
        >>> is_torch_version(">=", "2.0")
        True
    """
    return bool(_operation(operation)(_parse(torch_version()), _parse(version)))

"""Shaping logged values for trackers: scalars out of tensors, flat hyperparameter dicts, and
one warning per key for a value a tracker cannot take (never an exception inside the loop).
"""

from __future__ import annotations

import numbers
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "SkipWarner",
    "check_table_input",
    "flatten_dict",
    "require_rows",
    "to_hparam",
    "to_scalar",
]

_PLAIN_SCALARS = (int, float)


def to_scalar(value: Any) -> int | float | None:
    """Return ``value`` as a Python int/float, or None when it is not a single real number.

    Accepts ints, floats, bools, numpy scalars and one-element tensors (``loss.detach()``).
    """
    kind = type(value)
    if kind is float or kind is int:
        return value
    if kind is bool:
        return int(value)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        return value.item()
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "size", None) == 1:  # one-element numpy array
        try:
            out = item()
        except (TypeError, ValueError):
            return None
        return out if isinstance(out, _PLAIN_SCALARS) and not isinstance(out, bool) else None
    return None


def flatten_dict(values: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into one level, joining keys with ``sep`` (``{"a": {"b": 1}}`` ->
    ``{"a/b": 1}``), for trackers whose hyperparameters must be flat.
    """
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_dict(value, sep=sep, prefix=name))
        else:
            flat[name] = value
    return flat


def to_hparam(value: Any) -> int | float | str | bool:
    """Return ``value`` as a type every hyperparameter store takes: a number, a bool or a string.

    Lists, None, dtypes and other objects become their ``str()`` so nothing is silently lost.
    """
    if isinstance(value, bool | str):
        return value
    scalar = to_scalar(value)
    return str(value) if scalar is None else scalar


class SkipWarner:
    """Warn once per key that a value was skipped, so a bad metric costs one line, not one per step."""

    def __init__(self, tracker_name: str) -> None:
        self.tracker_name = tracker_name
        self.warned: set[str] = set()

    def skip(self, key: str, value: Any, accepted: str = "a single number") -> None:
        """Record that ``values[key]`` was dropped; warns the first time this key is dropped."""
        if key in self.warned:
            return
        self.warned.add(key)
        warnings.warn(
            f"{self.tracker_name} tracker skipped {key!r}: got a {type(value).__name__}, but it "
            f"only takes {accepted}. Log a number (e.g. `loss.item()`) or use a tracker-specific "
            "method such as log_images. This warning is shown once per key.",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside hasten (the user's
    training loop), however many hasten layers (Accelerator, manager, tracker) sit between.
    """
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("hasten."):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def require_rows(table_name: str, data: list[list[Any]] | None) -> list[list[Any]]:
    """Return the rows of a ``log_table`` call, refusing a call that has none.

    Raises:
        ValueError: ``data`` is None (and no dataframe stood in for it).
    """
    if data is None:
        raise ValueError(
            f"log_table({table_name!r}) got neither data nor dataframe; pass rows as "
            "data=[[...], ...] (with columns=[...]) or a pandas dataframe."
        )
    return data


def check_table_input(table_name: str, data: Any, dataframe: Any) -> None:
    """Refuse a ``log_table`` call with neither ``data`` nor ``dataframe`` (see `require_rows`)."""
    if dataframe is None:
        require_rows(table_name, data)

"""Names of Python objects: a readable name for messages, and dotted attribute paths."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["get_pretty_name", "recursive_getattr"]


def get_pretty_name(obj: Any) -> str:
    """Return ``obj``'s qualified name, or its class's for an instance (for logs and errors)."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    for attribute in ("__qualname__", "__name__"):
        name = getattr(obj, attribute, None)
        if name is not None:
            return str(name)
    return str(obj)


def recursive_getattr(obj: Any, attr: str) -> Any:
    """Follow the dotted path `attr` from `obj`: ``recursive_getattr(model, "encoder.layer")``.

    Raises:
        AttributeError: a step of the path does not exist (Python's message names it).
    """
    return functools.reduce(getattr, attr.split("."), obj)

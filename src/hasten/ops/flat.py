"""Flatten nested tensors into a few contiguous buffers, and put the results back in place.

Collectives pay a fixed cost per call (about 30-50 us over gloo on loopback), so sending ten
small tensors as ten calls costs ten times what one call costs. `flatten` lists the tensor
leaves of a structure and returns how to rebuild it; `buckets` groups leaves that can travel
in one buffer (same dtype and device, up to a size cap) so each group is a single collective.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from hasten.core.nested import honor_type, rebuild_mapping

__all__ = ["BUCKET_NUMEL", "buckets", "flatten"]

# Above this many elements a bucket is sent on its own: packing it would copy a large tensor
# for no gain, since one big collective is already bandwidth-bound.
BUCKET_NUMEL = 1 << 22

_Tensor = torch.Tensor
Rebuild = Callable[[Sequence[Any]], Any]


def _single(outs: Sequence[Any]) -> Any:
    return outs[0]


def _path_to_bad_leaf(data: Any, prefix: str = "") -> tuple[str, Any] | None:
    if isinstance(data, _Tensor):
        return None
    if isinstance(data, Mapping):
        items: Any = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        return prefix, data
    for key, value in items:
        found = _path_to_bad_leaf(value, f"{prefix}[{key!r}]")
        if found is not None:
            return found
    return None


def _reject(data: Any, op: str, hint: str) -> TypeError:
    path, leaf = _path_to_bad_leaf(data) or ("", data)
    where = f" at {path}" if path else ""
    text = repr(leaf)
    text = text if len(text) <= 60 else text[:57] + "..."
    return TypeError(
        f"`{op}` only works on tensors in nested list/tuple/dict structures, but got "
        f"{type(leaf).__name__} ({text}){where}. {hint}"
    )


def flatten(
    data: Any, op: str, hint: str = "Convert it to a tensor first."
) -> tuple[list[Any], Rebuild]:
    """Return the tensor leaves of ``data`` in order and a function rebuilding it from new leaves.

    Raises:
        TypeError: a leaf is not a tensor (the message names its path and ``hint``).
    """
    if isinstance(data, _Tensor):
        return [data], _single
    if type(data) is dict:
        values = list(data.values())
        if all(isinstance(v, _Tensor) for v in values):
            keys = list(data)
            return values, lambda outs: dict(zip(keys, outs))
    leaves: list[Any] = []

    def collect(obj: Any) -> None:
        if isinstance(obj, _Tensor):
            leaves.append(obj)
        elif isinstance(obj, Mapping):
            for value in obj.values():
                collect(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                collect(value)
        else:
            raise _reject(data, op, hint)

    collect(data)

    def rebuild(outs: Sequence[Any]) -> Any:
        it = iter(outs)

        def put(obj: Any) -> Any:
            if isinstance(obj, _Tensor):
                return next(it)
            if isinstance(obj, Mapping):
                return rebuild_mapping(obj, {k: put(v) for k, v in obj.items()})
            return honor_type(obj, (put(v) for v in obj))

        return put(data)

    return leaves, rebuild


def buckets(leaves: Sequence[torch.Tensor], limit: int = BUCKET_NUMEL) -> list[list[int]]:
    """Group leaf indices that can share one buffer: same dtype and device, at most ``limit`` elements."""
    if len(leaves) == 1:
        return [[0]]
    open_groups: dict[tuple[torch.dtype, torch.device], tuple[list[int], list[int]]] = {}
    groups: list[list[int]] = []
    for index, tensor in enumerate(leaves):
        numel = tensor.numel()
        if numel >= limit:
            groups.append([index])
            continue
        key = (tensor.dtype, tensor.device)
        entry = open_groups.get(key)
        if entry is None or entry[1][0] + numel > limit:
            entry = ([], [0])
            open_groups[key] = entry
            groups.append(entry[0])
        entry[0].append(index)
        entry[1][0] += numel
    return groups

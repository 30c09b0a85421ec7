"""Accelerate's device-map helpers on plain dicts: tidy a map, find leaves, fit a module with ties.

`hasten.big_modeling.planner` plans maps in one pass of its own; these are the public building
blocks Accelerate exposes (``accelerate.utils.modeling``), for code that assembles maps itself.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hasten.core.units import convert_file_size_to_int

__all__ = [
    "clean_device_map",
    "fallback_allocate",
    "get_module_leaves",
    "get_module_size_with_ties",
]


def clean_device_map(
    device_map: dict[str, int | str | torch.device], module_name: str = ""
) -> dict[str, int | str | torch.device]:
    """Merge, in place, the entries under each module that all share one device into one entry.

    ``{"a.x": 0, "a.y": 0, "b": 1}`` becomes ``{"a": 0, "b": 1}``; `module_name` limits the
    work to that subtree. Returns `device_map`.
    """
    prefix = f"{module_name}." if module_name else ""
    keys = [key for key in device_map if key.startswith(prefix)]
    values = [device_map[key] for key in keys]
    if len(values) > 1 and len(set(values)) == 1:
        for key in keys:
            del device_map[key]
        device_map[module_name] = values[0]
        return device_map
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {".".join(key.split(".")[:depth]) for key in keys if len(key) > len(module_name)}
    for child in sorted(children):
        clean_device_map(device_map, module_name=child)
    return device_map


def get_module_leaves(module_sizes: dict[str, int]) -> list[str]:
    """Return the names in `module_sizes` (from `compute_module_sizes`) that have no child entry."""
    parents = {name.rpartition(".")[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: dict[str, int],
    modules_to_treat: list[tuple[str, nn.Module]],
) -> tuple[int, list[str], list[nn.Module]]:
    """Size of a module when the modules holding its tied parameters must come along.

    Args:
        tied_params: names of parameters tied to the module's, living in other modules.
        module_size: the module's own size.
        module_sizes: name -> size, from `compute_module_sizes`.
        modules_to_treat: the (name, module) pairs still to place; each tied parameter must
            belong to one of them.

    Returns:
        The combined size (each tied parameter counted once), and the names and modules brought
        along, in `tied_params` order.

    Raises:
        ValueError: a tied parameter belongs to none of `modules_to_treat`.
    """
    names: list[str] = []
    modules: list[nn.Module] = []
    total = module_size
    for param in tied_params:
        owner = next(((n, m) for n, m in modules_to_treat if param.startswith(f"{n}.")), None)
        if owner is None:
            raise ValueError(
                f"tied parameter {param!r} belongs to none of the modules still to place "
                f"({[n for n, _ in modules_to_treat]}); list its module in modules_to_treat"
            )
        names.append(owner[0])
        modules.append(owner[1])
        total += module_sizes[owner[0]] - module_sizes[param]
    return total, names, modules


def _inside(param: str, name: str) -> bool:
    return f"{param}.".startswith(f"{name}.")


def _children(module: Any) -> list[tuple[str, Any]]:
    if isinstance(module, torch.Tensor):
        return []
    return list(module.named_parameters(recurse=False)) + list(module.named_children())


def fallback_allocate(
    modules: list[tuple[str, nn.Module]],
    module_sizes: dict[str, int],
    size_limit: int | str,
    no_split_module_classes: list[str] | None = None,
    tied_parameters: list[list[str]] | None = None,
) -> tuple[str | None, nn.Module | None, list[tuple[str, nn.Module]]]:
    """Find, breadth-first, the first module (or piece of one) that fits in `size_limit`.

    Modules too big are split into their parameters and children unless their class is in
    `no_split_module_classes`; a module's size includes the modules tied to it.

    Returns:
        ``(name, module, remaining)``: the module found and `modules` without it (its ancestors
        replaced by their other pieces), or ``(None, None, modules)`` when nothing fits or
        `size_limit` is not a size.
    """
    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split = set(no_split_module_classes or [])
    ties = tied_parameters or []
    queue = list(modules)
    found: tuple[str, Any] | None = None
    while queue:
        name, module = queue.pop(0)
        outside = [
            param
            for group in ties
            if any(_inside(p, name) for p in group) and not all(_inside(p, name) for p in group)
            for param in group
            if not _inside(param, name)
        ]
        size, _, _ = get_module_size_with_ties(outside, module_sizes[name], module_sizes, queue)
        if size <= limit:
            found = (name, module)
            break
        children = _children(module)
        if children and type(module).__name__ not in no_split:
            queue = [(f"{name}.{child}", value) for child, value in children] + queue
    if found is None:
        return None, None, modules
    return found[0], found[1], _without(modules, found[0])


def _without(modules: list[tuple[str, Any]], target: str) -> list[tuple[str, Any]]:
    """`modules` with each ancestor of `target` replaced by its pieces, then `target` removed."""
    remaining = list(modules)
    parts = target.split(".")
    for depth in range(1, len(parts)):
        parent = ".".join(parts[:depth])
        index = next((i for i, (n, _) in enumerate(remaining) if n == parent), None)
        if index is not None:
            pieces = [(f"{parent}.{n}", v) for n, v in _children(remaining[index][1])]
            remaining[index : index + 1] = pieces
    return [(n, m) for n, m in remaining if n != target]

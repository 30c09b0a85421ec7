"""FSDP1 full weights gathered a few at a time for ``save_model``, with public FSDP1 calls only.

The model's layout (names, full shapes and dtypes, in state dict order) is read once before
wrapping, so planning a save needs no state dict. Each part is gathered one FSDP unit at a
time with ``summon_full_params(unit, recurse=False, writeback=False, rank0_only=True)``: every
process takes part in the unit's all-gather, only rank 0 keeps it, and rank 0 copies the
part's tensors out. Peak memory beyond the model: the part being written plus one unit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hasten.strategies.rebind import canonical_name

__all__ = ["gather_units", "weights_layout"]


def weights_layout(module: nn.Module, ties: list[list[str]]) -> dict[str, torch.Tensor] | None:
    """Meta stand-ins of ``module``'s state dict (the unwrapped model); tied names share one.

    None when the state dict holds something else than tensors (``get_extra_state``), which
    only the whole state dict can give.
    """
    layout: dict[str, torch.Tensor] = {}
    for name, value in module.state_dict().items():
        if not isinstance(value, torch.Tensor):
            return None
        layout[canonical_name(name)] = torch.empty(value.shape, dtype=value.dtype, device="meta")
    for group in ties:
        present = [name for name in group if name in layout]
        for alias in present[1:]:
            layout[alias] = layout[present[0]]
    return layout


def _places(root: nn.Module) -> tuple[dict[str, nn.Module], dict[str, nn.Module]]:
    """Canonical module path -> the innermost module there, and -> the FSDP unit there."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    modules: dict[str, nn.Module] = {}
    units: dict[str, nn.Module] = {}
    for path, module in root.named_modules():
        clean = canonical_name(f"{path}.").rstrip(".")
        if isinstance(module, FullyShardedDataParallel):
            units.setdefault(clean, module)
        else:
            modules[clean] = module  # pre-order: a wrapped module comes after its wrapper
    return modules, units


def _unit_of(path: str, units: dict[str, nn.Module]) -> nn.Module:
    """The innermost FSDP unit above module ``path`` (the root unit at worst)."""
    while path not in units:
        if not path:
            raise ValueError("save_model under FSDP1 needs the model prepared (an FSDP root).")
        path = path.rpartition(".")[0]
    return units[path]


def gather_units(root: nn.Module, part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full CPU copies of ``part``'s entries (stand-ins from `weights_layout`) on rank 0.

    Every process calls it with the same names. One stand-in under several names (a tied
    weight) is copied once; the other names get views of the copy, as in the unwrapped model.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    modules, units = _places(root)
    first: dict[int, str] = {}
    for name, stand_in in part.items():
        first.setdefault(id(stand_in), name)
    groups: dict[int, tuple[nn.Module, list[str]]] = {}
    for name in first.values():
        unit = _unit_of(name.rpartition(".")[0], units)
        groups.setdefault(id(unit), (unit, []))[1].append(name)
    main = dist.get_rank() == 0
    got: dict[str, torch.Tensor] = {}
    for unit, names in groups.values():
        summon = FullyShardedDataParallel.summon_full_params(
            unit, recurse=False, writeback=False, rank0_only=True
        )
        with summon, torch.no_grad():
            for name in names if main else ():
                path, _, leaf = name.rpartition(".")
                value: Any = getattr(modules[path], leaf)
                got[name] = value.detach().to("cpu", dtype=part[name].dtype, copy=True)
    if not main:
        return {}
    out = {}
    for name, stand_in in part.items():
        kept = first[id(stand_in)]
        out[name] = got[kept] if kept == name else got[kept].detach()
    return out

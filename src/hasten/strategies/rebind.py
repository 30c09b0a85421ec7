"""Point optimizers at the parameters that replaced theirs during set-up, matched by name.

Sharding engines replace every parameter object (FSDP2: `DTensor` parameters; FSDP1 with
``use_orig_params``: views into flat parameters), so an optimizer built on the user's model holds
stale tensors after prepare. The match is by canonical parameter name (wrapper prefixes such as
``_fsdp_wrapped_module.`` or ``_checkpoint_wrapped_module.`` removed), never by position, and a
parameter that cannot be matched is an error rather than a silently frozen weight. The "before"
side is recorded as ids, not tensors, so set-up can free the unsharded parameters as it shards
them (only an optimizer that holds them keeps them alive, and then their ids stay unique).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["WRAPPER_PREFIXES", "canonical_name", "parameter_ids", "rebind_optimizers"]

#: Name pieces that wrappers insert into parameter names.
WRAPPER_PREFIXES = (
    "_fsdp_wrapped_module.",
    "_checkpoint_wrapped_module.",
    "_orig_mod.",
    "_offload_wrapped_module.",
)


def canonical_name(name: str) -> str:
    """``name`` without the pieces wrappers insert (``a._fsdp_wrapped_module.w`` -> ``a.w``)."""
    for piece in WRAPPER_PREFIXES:
        name = name.replace(piece, "")
    return name


def parameter_ids(module: torch.nn.Module) -> dict[str, int]:
    """Canonical name -> id of each parameter of ``module`` (shared ones once): the "before"."""
    return {canonical_name(n): id(p) for n, p in module.named_parameters()}


def _moves(
    befores: Sequence[dict[str, int]], afters: Sequence[dict[str, Any]]
) -> tuple[dict[int, Any], dict[int, str]]:
    moves: dict[int, Any] = {}
    lost: dict[int, str] = {}
    for before, after in zip(befores, afters):
        for name, old in before.items():
            new = after.get(name)
            if new is None:
                lost[old] = name
            elif id(new) != old:
                moves[old] = new
    return moves, lost


def rebind_optimizers(
    optimizers: Sequence[torch.optim.Optimizer],
    befores: Sequence[dict[str, int]],
    afters: Sequence[dict[str, Any]],
) -> None:
    """Replace, in place, each optimizer parameter that set-up replaced (same name).

    Args:
        optimizers: the optimizers to retarget.
        befores: per model, canonical name -> id of the parameter before set-up
            (`parameter_ids`).
        afters: per model, canonical name -> parameter after set-up.

    Raises:
        ValueError: a held parameter has no counterpart after set-up, two held parameters map
            to one, or an optimizer already has state for a parameter whose layout changed.
    """
    moves, lost = _moves(befores, afters)
    if not moves and not lost:
        return
    for optimizer in optimizers:
        _rebind(optimizer, moves, lost)


def _rebind(optimizer: torch.optim.Optimizer, moves: dict[int, Any], lost: dict[int, str]) -> None:
    name = type(optimizer).__name__
    held = [p for group in optimizer.param_groups for p in group["params"]]
    missing = [lost[id(p)] for p in held if id(p) in lost]
    if missing:
        raise ValueError(
            f"The optimizer {name} holds {len(missing)} parameter(s) that no longer exist after "
            f"the model was prepared (first: {', '.join(missing[:3])}). Build the optimizer "
            "from the same model you pass to prepare(), or prepare the model first and build "
            "the optimizer on the prepared model's parameters."
        )
    changed = [p for p in held if id(p) in moves]
    stale = [p for p in changed if p in optimizer.state and optimizer.state[p]]
    if stale and any(type(moves[id(p)]) is not type(p) for p in stale):
        raise ValueError(
            f"The optimizer {name} already has state (it stepped) for parameters the engine "
            "re-laid out while preparing the model; that state cannot follow. Call prepare() "
            "before the first optimizer step, then load_state() to restore a checkpoint."
        )
    new_ids: set[int] = set()
    for group in optimizer.param_groups:
        group["params"] = [moves.get(id(p), p) for p in group["params"]]
        new_ids.update(id(p) for p in group["params"])
    if len(new_ids) != len(held):
        raise ValueError(
            f"The optimizer {name} held {len(held)} parameters but {len(new_ids)} remain after "
            "the model was prepared (several were merged into one). With FSDP1 set "
            "use_orig_params=True, or build the optimizer after prepare(model)."
        )
    if stale:
        state = {moves.get(id(p), p): s for p, s in optimizer.state.items()}
        optimizer.state.clear()
        optimizer.state.update(state)

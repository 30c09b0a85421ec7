"""Seeding and synchronising random number generators across processes.

`set_seed` seeds Python, NumPy, torch and the accelerator of this process. `synchronize_rng_state`
makes every process continue from process 0's generator state (torch CPU, an accelerator, XLA or
a given `torch.Generator`), e.g. so that shuffling agrees before each epoch.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from hasten.config.enums import RNGType
from hasten.core.imports import require
from hasten.ops.comm import current_comm
from hasten.platforms.registry import current_platform

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed ``random``, NumPy, torch and this process's accelerator for reproducible runs.

    Args:
        seed: the seed.
        device_specific: add the process index, so each process draws different numbers.
        deterministic: also ask torch for deterministic algorithms (may be slower).

    Raises:
        TypeError: ``seed`` is not an integer.
    """
    try:
        seed = operator.index(seed)
    except TypeError:
        raise TypeError(
            f"set_seed(seed={seed!r}) needs an integer seed, got {type(seed).__name__}; "
            "pass e.g. set_seed(42) (convert strings with int())."
        ) from None
    if device_specific:
        seed += current_comm().process_index
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # torch.manual_seed also seeds CUDA/MPS/XPU lazily; the platform call covers the others.
    torch.manual_seed(seed)
    platform = current_platform()
    if platform.name != "cpu":
        platform.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _device_module(name: str) -> object:
    module = getattr(torch, name, None)
    available = getattr(module, "is_available", None)
    if module is None or available is None or not available():
        raise RuntimeError(
            f"Cannot synchronize the {name!r} generator: no {name} device is available in this "
            "process. Synchronize RNGType.TORCH (or the generator of your device) instead."
        )
    return module


def _accessors(
    rng_type: RNGType, generator: torch.Generator | None
) -> tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], Any]]:
    """Return how to read and restore the state of generator ``rng_type``."""
    if rng_type == RNGType.TORCH:
        return torch.get_rng_state, torch.set_rng_state
    if rng_type == RNGType.GENERATOR:
        if generator is None:
            raise ValueError(
                "synchronize_rng_state(rng_type='generator') needs `generator=`: pass the "
                "torch.Generator to synchronize."
            )
        return generator.get_state, generator.set_state
    if rng_type == RNGType.XLA:
        require("torch_xla", feature="synchronizing the XLA generator")
        import torch_xla.core.xla_model as xm  # optional: torch_xla

        return (lambda: torch.tensor(xm.get_rng_state())), (
            lambda s: xm.set_rng_state(int(s.item()))
        )
    module = _device_module(rng_type.value)
    return module.get_rng_state, module.set_rng_state  # type: ignore[attr-defined]


def synchronize_rng_state(
    rng_type: RNGType | str | None = None, generator: torch.Generator | None = None
) -> None:
    """Give every process the state of process 0's ``rng_type`` generator.

    Args:
        rng_type: which generator (an `RNGType` or its value, e.g. ``"torch"``, ``"cuda"``).
        generator: the generator to synchronize when ``rng_type`` is ``"generator"``.

    Raises:
        ValueError: ``rng_type`` is missing or unknown, or ``generator`` is missing.
        RuntimeError: the requested device generator does not exist in this process.
    """
    try:
        kind = RNGType(rng_type)
    except ValueError:
        raise ValueError(
            f"synchronize_rng_state(rng_type={rng_type!r}) is not a generator type; use one of "
            f"{RNGType.list()}."
        ) from None
    get_state, set_state = _accessors(kind, generator)
    comm = current_comm()
    if comm.num_processes == 1:
        return
    state = get_state()
    moved = state.to(comm.device)
    comm.broadcast(moved, 0, "synchronize_rng_state", state)
    set_state(moved.cpu())


def synchronize_rng_states(
    rng_types: Iterable[RNGType | str], generator: torch.Generator | None = None
) -> None:
    """Synchronize each generator in ``rng_types`` to process 0's state (see `synchronize_rng_state`)."""
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)

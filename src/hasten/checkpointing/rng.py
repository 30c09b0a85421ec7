"""Capture and restore every random generator a training step can touch, per process."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "has_saved_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """The python, numpy, torch and accelerator RNG states of this process (Accelerate's keys)."""
    states: dict[str, Any] = {
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        states["torch_xpu_manual_seed"] = xpu.get_rng_state_all()
    return states


def _restorers() -> dict[str, Any]:
    restorers: dict[str, Any] = {
        "random_state": random.setstate,
        "numpy_random_seed": np.random.set_state,
        "torch_manual_seed": torch.set_rng_state,
        "torch_cuda_manual_seed": torch.cuda.set_rng_state_all,
    }
    xpu = getattr(torch, "xpu", None)
    if xpu is not None:
        restorers["torch_xpu_manual_seed"] = xpu.set_rng_state_all
    return restorers


def restore_rng_state(states: dict[str, Any], strict: bool = True) -> None:
    """Put back what `capture_rng_state` took.

    Raises:
        RuntimeError: a generator could not be restored (named), unless ``strict`` is False, in
            which case it warns once for that generator and goes on.
    """
    restorers = _restorers()
    for key, value in states.items():
        try:
            restorers[key](value)
        except Exception as exc:  # noqa: BLE001 - re-raised with the part named, or warned
            message = f"Could not restore the RNG state {key!r}: {exc}"
            if strict:
                raise RuntimeError(message + " (pass strict=False to skip it)") from exc
            warnings.warn(message, RuntimeWarning, stacklevel=2)


def has_saved_rng_state(manifest: dict[str, Any] | None, rank: int) -> bool:
    """Whether process ``rank`` has RNG states in the checkpoint of ``manifest``; warns if not.

    Each process restores its own ``random_states_<rank>.pkl``; a checkpoint loaded by more
    processes than wrote it (a resharded resume) has none for the new ones. That is expected,
    not damage: those processes keep their RNG states, and the warning says so.
    """
    saved = (manifest or {}).get("num_processes")
    if saved is None or rank < saved:  # (None: not recorded, e.g. written by Accelerate)
        return True
    warnings.warn(
        f"The checkpoint was saved by {saved} process(es), so process {rank} has no saved RNG "
        "states; it keeps its current ones (models and optimizers are resharded). Load on "
        f"{saved} process(es) to restore every RNG state.",
        RuntimeWarning,
        stacklevel=5,
    )
    return False

"""Capture and restore every random generator a training step can touch, per process."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

__all__ = [
    "capture_rng_state",
    "has_saved_rng_state",
    "load_pipeline_states",
    "pipeline_state_of",
    "restore_rng_state",
]


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


def pipeline_state_of(loader: Any) -> dict[str, Any] | None:
    """The data-pipeline random streams of a prepared loader on this process (None: none)."""
    state = getattr(loader, "pipeline_state", None)
    return state() if callable(state) else None


def load_pipeline_states(loaders: list[Any], states: list[Any] | None) -> None:
    """Hand each loader the pipeline streams this process saved for it (see `pipeline_state_of`).

    A checkpoint without them (written by Accelerate, or by an older hasten) leaves the loaders
    as they are: their first resumed batch is then drawn from the restored global generators.
    """
    if not states:
        return
    for loader, state in zip(loaders, states):
        load = getattr(loader, "load_pipeline_state", None)
        if callable(load):
            load(state)


def has_saved_rng_state(
    manifest: dict[str, Any] | None, rank: int, num_processes: int | None = None
) -> bool:
    """Whether process ``rank`` has RNG states in the checkpoint of ``manifest``; warns if not.

    The rule under a change of world size: process ``r`` restores the states process ``r``
    saved when there was one; a new process keeps its own (warned, on that process); with
    fewer processes the saved states of the processes that are gone are not used (warned once,
    on process 0, given ``num_processes``). Either way the per-process streams (dropout, random
    transforms) no longer draw what the saved run drew: only the data order stays exact.

    Each process restores its own ``random_states_<rank>.pkl``; a checkpoint loaded by more
    processes than wrote it (a resharded resume) has none for the new ones. That is expected,
    not damage: those processes keep their RNG states, and the warning says so.
    """
    saved = (manifest or {}).get("num_processes")
    if saved is None or rank < saved:  # (None: not recorded, e.g. written by Accelerate)
        if saved is not None and num_processes is not None and rank == 0 < num_processes < saved:
            warnings.warn(
                f"The checkpoint was saved by {saved} processes and is loaded by "
                f"{num_processes}: the RNG states of processes {num_processes} to {saved - 1} "
                "are not restored, and each process's random draws (dropout, random "
                "transforms, collators) differ from the saved run's; the data order and "
                f"every sample once per epoch stay exact. Load on {saved} processes to restore "
                "every RNG state.",
                RuntimeWarning,
                stacklevel=5,
            )
        return True
    warnings.warn(
        f"The checkpoint was saved by {saved} process(es), so process {rank} has no saved RNG "
        "states; it keeps its current ones (models and optimizers are resharded). Load on "
        f"{saved} process(es) to restore every RNG state.",
        RuntimeWarning,
        stacklevel=5,
    )
    return False

"""A saved data position read by another number of processes: the same samples, each once.

The order of an epoch is drawn by the sampler's generator, which the checkpoint carries, so it
does not depend on the number of processes. What depends on it is how far into that order a
saved position is, and how each global batch is cut:

- ``split_batches=True``: a global batch has a fixed size and each process takes its slice,
  so ``k`` batches handed out per process are ``k`` global batches at any world size;
- per-process batches: ``k`` batches per process at ``W1`` processes are ``k * W1`` batches
  of the order, i.e. ``k * W1 / W2`` per process at ``W2`` (which must divide).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "adopt_saved_generator",
    "kept_accumulation",
    "kept_schedule",
    "loader_processes",
    "rescale_position",
]


def loader_processes(loader: Any) -> tuple[int, bool]:
    """(processes the loader is sharded over, whether it splits batches; False on 1 process,
    where nothing is sharded: a saved state says which it was)."""
    for holder in (loader.batch_sampler, loader.sampler):
        if hasattr(holder, "num_processes"):
            return int(holder.num_processes), bool(getattr(holder, "split_batches", False))
    dataset = loader.dataset
    if hasattr(dataset, "num_processes"):
        return int(dataset.num_processes), bool(getattr(dataset, "split_batches", False))
    return 1, False


def rescale_position(state: dict[str, Any], now: int, split: bool, keep: bool = False) -> int:
    """This process's batches to skip for a ``state`` saved by ``state["num_processes"]``.

    ``keep``: the accelerator keeps the global batch (``load_state(keep_global_batch=True)``):
    not warned.

    Raises:
        ValueError: per-process batches whose count in the order cannot be shared evenly by the
            new number of processes.
    """
    position = int(state["batches_yielded"])
    saved = int(state.get("num_processes", now))
    if saved == now or not position:
        return position
    if split or state.get("split_batches"):  # one global batch per step at any world size
        return position
    consumed = position * saved
    if consumed % now:
        raise ValueError(
            f"The checkpoint was saved by {saved} processes after {position} batches each "
            f"({consumed} per-process batches of the epoch), which {now} processes cannot share "
            f"evenly. Resume on a number of processes that divides {consumed}, or use "
            "DataLoaderConfiguration(split_batches=True) so the global batch is fixed."
        )
    if keep:
        return consumed // now
    warnings.warn(
        f"The checkpoint was saved by {saved} processes and is loaded by {now}: with per-process "
        f"batches the global batch changes ({saved} to {now} batches per step); the epoch goes "
        "on from the same place in the same order, each sample once. Use split_batches=True "
        "or load_state(..., keep_global_batch=True) to keep the global batch.",
        RuntimeWarning,
        stacklevel=4,
    )
    return consumed // now


def kept_accumulation(saved: int, now: int, accumulation: int) -> int:
    """Gradient accumulation steps that keep a global batch of ``saved x accumulation``
    per-process batches on ``now`` processes.

    Raises:
        ValueError: ``now`` processes cannot divide that global batch.
    """
    batches = saved * accumulation
    if batches % now:
        raise ValueError(
            f"keep_global_batch: the checkpoint's global batch is {batches} per-process batches "
            f"({saved} processes x {accumulation} accumulation steps), which {now} processes "
            f"cannot divide. Resume on a number of processes that divides {batches}, or raise "
            "gradient_accumulation_steps (or the per-process batch size) so it divides."
        )
    return batches // now


def kept_schedule(
    loaders: Iterable[Any], processes: int, accumulation: int, step: int
) -> tuple[int, int]:
    """(accumulation steps, micro-step count) that keep the saved global batch after a load by
    another number of processes (``load_state(keep_global_batch=True)``); unchanged otherwise."""
    saved = {int(n) for d in loaders if (n := getattr(d, "saved_processes", None))}
    if len(saved) != 1 or (before := saved.pop()) == processes:
        return accumulation, step
    return kept_accumulation(before, processes, accumulation), step * before // processes


def adopt_saved_generator(sampler: Any, rng: dict[str, Any]) -> torch.Generator | None:
    """Make ``sampler`` draw the saved epoch's order; return a generator to give back after.

    A loader sharded over several processes shuffles with a generator that the checkpoint
    carries (``sampler_generator``); one process alone shuffles from torch's global generator
    (Accelerate's behaviour), saved as ``torch``. Across that boundary the sampler is switched
    to what the saved run used: it adopts the saved generator from then on (exact in every
    later epoch), or draws this epoch from the global generator and gets its own generator back
    for the next epoch (later epochs are a different order: warned).
    """
    if not hasattr(sampler, "generator"):
        return None
    if "sampler_generator" in rng and sampler.generator is None:
        generator = torch.Generator()
        generator.set_state(rng["sampler_generator"])
        sampler.generator = generator
        return None
    saved_generator = any(key.endswith("_generator") for key in rng)
    if not saved_generator and "torch" in rng and sampler.generator is not None:
        warnings.warn(
            "The checkpoint was saved by 1 process whose sampler shuffles from torch's global "
            "generator; on several processes the sampler has a shared generator. The epoch in "
            "progress resumes exactly; later epochs are shuffled differently from the saved "
            "run. Give the DataLoader a generator (DataLoader(generator=...)) or use "
            "use_seedable_sampler=True to keep every epoch exact.",
            RuntimeWarning,
            stacklevel=4,
        )
        own, sampler.generator = sampler.generator, None
        return own
    return None

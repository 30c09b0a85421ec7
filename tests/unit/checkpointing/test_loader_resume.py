"""Resuming a prepared loader both ways (skip_first_batches or direct) replays the epoch exactly.

The reference is an uninterrupted two-epoch run; the random draw after each batch stands in
for dropout, so a resumed run that consumed the global RNG differently would show it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from hasten.data_loader import prepare_data_loader, skip_first_batches
from hasten.state._shared import reset_state

Trace = list[tuple[list[int], float]]


def _loader(seed: int) -> Any:
    reset_state()
    torch.manual_seed(seed)
    return prepare_data_loader(DataLoader(list(range(20)), batch_size=2, shuffle=True))


def _consume(loader: Any, count: int | None = None) -> Trace:
    """Batches with one global random draw after each (``count`` batches, or to the end)."""
    seen: Trace = []
    for batch in loader:
        seen.append((batch.tolist(), torch.rand(()).item()))
        if count is not None and len(seen) == count:
            break
    return seen


def _reference() -> Trace:
    loader = _loader(0)
    return _consume(loader) + _consume(loader)


def _restart(state: dict[str, Any], rng: torch.Tensor) -> Any:
    """A fresh loader (other seed) given a saved loader state and the saved global RNG."""
    loader = _loader(99)
    loader.load_state_dict(state)
    torch.set_rng_state(rng)
    return loader


def test_skip_copy_and_direct_iteration_resume_exactly() -> None:
    reference = _reference()
    loader = _loader(0)
    seen = _consume(loader, 3)
    resumed = _restart(loader.state_dict(), torch.get_rng_state())
    # Accelerate's convention: a skip copy for the rest of the epoch, then the loader itself.
    seen += _consume(skip_first_batches(resumed, 3)) + _consume(resumed)
    assert seen == reference
    loader = _loader(0)
    seen = _consume(loader, 3)
    resumed = _restart(loader.state_dict(), torch.get_rng_state())
    seen += _consume(resumed) + _consume(resumed)  # or iterate the loaded loader directly
    assert seen == reference


def test_state_taken_while_iterating_a_skip_copy_resumes() -> None:
    reference = _reference()
    loader = _loader(0)
    seen = _consume(loader, 3)
    resumed = _restart(loader.state_dict(), torch.get_rng_state())
    seen += _consume(skip_first_batches(resumed, 3), 4)
    state = resumed.state_dict()  # the prepared loader reports its skip copy's progress
    assert (state["epoch"], state["batches_yielded"]) == (0, 7)
    again = _restart(state, torch.get_rng_state())
    seen += _consume(skip_first_batches(again, 7)) + _consume(again)
    assert seen == reference
    assert again.state_dict() == {"epoch": 2, "batches_yielded": 0}


def test_skip_copy_made_before_the_load_still_replays() -> None:
    reference = _reference()
    loader = _loader(0)
    seen = _consume(loader, 5)
    state, rng = loader.state_dict(), torch.get_rng_state()
    fresh = _loader(99)
    copy = skip_first_batches(fresh, 5)
    fresh.load_state_dict(state)
    torch.set_rng_state(rng)
    seen += _consume(copy) + _consume(fresh)
    assert seen == reference

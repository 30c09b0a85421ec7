"""Where the data pipeline's random streams stand, so a resumed epoch draws what the first did.

A dataset's random transforms and a collator's random masks draw from the global generators
(torch, python ``random``, numpy) of the process that loads the batch:

- with ``num_workers=0`` the main process: the loader reads one batch ahead, so at a save the
  next batch was already drawn. `PipelineRng` keeps the generators' states taken just before
  each batch was loaded (after its indices were drawn); a resume loads that batch from them.
- with workers, each worker: torch seeds worker ``w`` with ``base_seed + w`` at the start of
  every epoch, and batch ``n`` of an iteration goes to worker ``n % num_workers``. Every batch
  comes back with its worker's states after it was made; a resume starts worker ``i`` from the
  states of the worker that would have made the ``i``-th next batch (or reseeds it as torch
  seeded that worker, when it had not handed out a batch yet).

Everything here is per process: a rank's pipeline state is saved in its own RNG file.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = [
    "GlobalRngState",
    "PipelineRng",
    "WorkerSlot",
    "capture_global_rng",
    "restore_global_rng",
]

# (torch CPU state, python random state, numpy state): everything a transform commonly uses.
GlobalRngState = tuple[torch.Tensor, Any, Any]
# ("seed", w): a worker that torch seeded as worker w and that had handed out nothing yet;
# ("state", states): a worker's generators after its last handed-out batch.
WorkerSlot = tuple[str, Any]


def capture_global_rng() -> GlobalRngState:
    """The torch, python and numpy global generator states of this process."""
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def restore_global_rng(states: GlobalRngState) -> None:
    """Put back what `capture_global_rng` took."""
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    np.random.set_state(states[2])


class _FromWorker(NamedTuple):
    """A batch made in a worker, with the worker's generator states right after it."""

    batch: Any
    after: GlobalRngState


class _Collate:
    """Worker-side collate: make the batch, then note the generators' states (picklable)."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> _FromWorker:
        return _FromWorker(self.collate_fn(samples), capture_global_rng())


class _WorkerInit:
    """Worker-side init: start worker ``i`` where slot ``i`` says, around the user's init."""

    def __init__(self, user_init: Callable[[int], None] | None, slots: list[WorkerSlot]) -> None:
        self.user_init = user_init
        self.slots = slots

    def __call__(self, worker_id: int) -> None:
        slot: WorkerSlot = (
            self.slots[worker_id] if worker_id < len(self.slots) else ("seed", worker_id)
        )
        kind, value = slot
        if kind == "seed" and value != worker_id:
            info = get_worker_info()
            base_seed = info.seed - info.id  # type: ignore[union-attr]
            _seed_like_torch(base_seed, int(value))
        if self.user_init is not None:
            self.user_init(worker_id)
        if kind == "state":
            restore_global_rng(value)


def _seed_like_torch(base_seed: int, worker_id: int) -> None:
    """Seed this process's generators as torch's worker loop seeds worker ``worker_id``."""
    # private but stable since torch 1.9: the numpy seed torch derives for a worker
    from torch.utils.data._utils.worker import _generate_state

    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_generate_state(base_seed, worker_id))


class PipelineRng:
    """This process's record of the data pipeline's random streams for the current iteration.

    ``start`` is the number of batches of the epoch before the iteration's first one; batch
    numbers below count from the epoch's start (the first batch is 1).
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.start = 0
        self.before: dict[int, GlobalRngState] = {}  # main process: states before batch n
        self.after: dict[int, GlobalRngState] = {}  # workers: states after batch n
        self.fresh: list[WorkerSlot] = []  # how this iteration's workers were started
        self.pending: dict[str, Any] | None = None  # a loaded state the next iteration uses

    def begin(self, start: int) -> dict[str, Any] | None:
        """Start recording an iteration that begins after ``start`` batches; return the loaded
        state it must resume from (None: a fresh iteration)."""
        resume, self.pending = self.pending, None
        if resume is not None and int(resume["position"]) != start:
            resume = None  # (a different skip than the saved position: nothing to replay)
        self.start, self.before, self.after = start, {}, {}
        slots = resume.get("workers") if resume is not None else None
        self.fresh = list(slots) if slots else [("seed", w) for w in range(self.num_workers)]
        return resume

    def indices(self, source: Iterable[Any], resume: dict[str, Any] | None) -> Iterator[Any]:
        """The index stream of a main-process iteration, noting the states before each batch.

        On resume the first batch is loaded from the saved states.
        """
        number = self.start
        first = resume.get("main") if resume is not None else None
        for index in source:  # the sampler's own draws happen inside this next()
            number += 1
            if first is not None:
                restore_global_rng(first)
                first = None
            self.before[number] = capture_global_rng()
            self.before.pop(number - 3, None)
            yield index

    def unwrap(self, fetch: Callable[[], Any]) -> Callable[[], Any]:
        """A fetch of worker batches that keeps each batch's worker states."""
        after, counter = self.after, [self.start]
        keep = self.num_workers + 2

        def fetch_and_note() -> Any:
            made = fetch()
            counter[0] += 1
            after[counter[0]] = made.after
            after.pop(counter[0] - keep, None)
            return made.batch

        return fetch_and_note

    def worker_init(self, user_init: Callable[[int], None] | None) -> _WorkerInit:
        """The worker init function that starts this iteration's workers as recorded."""
        return _WorkerInit(user_init, self.fresh)

    def collate(self, collate_fn: Callable[[Any], Any]) -> _Collate:
        """The collate function that sends each batch back with its worker's states."""
        return _Collate(collate_fn)

    def state(self, position: int) -> dict[str, Any]:
        """What a resume after ``position`` batches of the epoch needs to redraw the same."""
        state: dict[str, Any] = {"position": position}
        if self.num_workers == 0:
            state["main"] = self.before.get(position + 1)
            return state
        slots: list[WorkerSlot] = []
        for i in range(self.num_workers):
            last = position + 1 - self.num_workers + i  # the last batch of the next i-th's worker
            if last > self.start:
                slots.append(("state", self.after[last]))
            else:  # that worker had handed out nothing in this iteration: as it was started
                slots.append(self.fresh[(position + i - self.start) % self.num_workers])
        state["workers"] = slots
        return state

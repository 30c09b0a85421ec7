"""Samplers that give each process its own share of the batches, and a shuffle every process agrees on.

`BatchSamplerShard` wraps the user's batch sampler: it hands process ``process_index`` every
``num_processes``-th batch (or its slice of every batch under ``split_batches``), and with
``even_batches`` completes the last round with samples from the start of the data so that all
processes see the same number of equally sized batches (collectives never wait on a missing
batch). `SeedableRandomSampler` shuffles from ``seed + epoch`` so every process draws the same
permutation without communicating.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler

__all__ = ["BatchSamplerShard", "SeedableRandomSampler", "get_sampler", "override_even_batches"]


class SeedableRandomSampler(RandomSampler):
    """A `RandomSampler` whose permutation depends only on ``initial_seed + epoch``.

    Every process builds the same permutation from the same seed, and each epoch gets a new
    one (`set_epoch`, or automatically after a full pass), so no RNG needs synchronizing.

    Args:
        *args: forwarded to `RandomSampler` (``data_source``, ``replacement``, ``num_samples``).
        **kwargs: forwarded to `RandomSampler` (``generator``), except ``data_seed``: the base
            seed, by default torch's current initial seed.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        data_seed: int | None = kwargs.pop("data_seed", None)
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator(device=torch.get_default_device())
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Choose the permutation of the next pass (the same on every process)."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, int]:
        """Return what decides the next permutation: the seed and the epoch."""
        return {"initial_seed": int(self.initial_seed), "epoch": int(self.epoch)}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Restore the seed and epoch saved by `state_dict`."""
        self.initial_seed = int(state_dict["initial_seed"])
        self.epoch = int(state_dict["epoch"])


def _check_split(batch_size: int | None, num_processes: int, what: str) -> None:
    if batch_size is None or batch_size % num_processes != 0:
        raise ValueError(
            f"To use `{what}` in `split_batches` mode, the batch size ({batch_size!r}) needs to "
            f"be a round multiple of the number of processes ({num_processes!r}): each batch is "
            f"cut into {num_processes} equal parts. Use a batch size divisible by "
            f"{num_processes} or set split_batches=False."
        )


class BatchSamplerShard(BatchSampler):
    """Yield only the batches (or batch slices) of one process out of ``num_processes``.

    Without ``split_batches``, process ``i`` gets batches ``i, i + n, i + 2n, ...`` of the
    wrapped sampler; with it, every batch is cut into ``n`` equal slices and process ``i`` gets
    slice ``i``. With ``drop_last`` the last incomplete round is dropped; otherwise, with
    ``even_batches``, it is completed with indices from the start so every process gets the
    same number of full batches; without ``even_batches`` the shards may differ in length.

    Args:
        batch_sampler: the batch sampler to shard (anything yielding lists of indices).
        num_processes: how many processes share the data.
        process_index: which share this sampler yields.
        split_batches: slice each batch across processes instead of dealing whole batches.
        even_batches: complete the last round so every process gets as many full batches.

    Raises:
        ValueError: ``split_batches`` with a batch size not divisible by ``num_processes``.
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        # No super().__init__: the wrapped sampler already holds sampler/batch_size/drop_last.
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)  # type: ignore[assignment]
        self.drop_last: bool = getattr(batch_sampler, "drop_last", False)
        if split_batches:
            _check_split(self.batch_size, num_processes, "BatchSamplerShard")

    @property
    def sampler(self) -> Any:
        """The index sampler below the wrapped batch sampler (settable, for seedable shuffling)."""
        return getattr(self.batch_sampler, "sampler", None)

    @sampler.setter
    def sampler(self, sampler: Any) -> None:
        self.batch_sampler.sampler = sampler  # type: ignore[attr-defined]

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped sampler (all processes together)."""
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __len__(self) -> int:
        total = self.total_length
        if self.split_batches:
            return total - int(self._misses_short_last_batch())
        rounds, rest = divmod(total, self.num_processes)
        if rest == 0 or self.drop_last:
            return rounds
        if self.even_batches:
            return rounds + 1
        return rounds + 1 if self.process_index < rest else rounds

    def _misses_short_last_batch(self) -> bool:
        """Without even_batches, a short last batch may not reach this process's slice."""
        if self.drop_last or self.even_batches:
            return False
        try:
            rest = len(self.batch_sampler.sampler) % self.batch_size  # type: ignore[attr-defined, operator]
        except (AttributeError, TypeError):
            return False
        return 0 < rest <= (self.batch_size // self.num_processes) * self.process_index  # type: ignore[operator]

    def __iter__(self) -> Iterator[list[int]]:
        if self.split_batches:
            return self._iter_slices()
        return self._iter_whole_batches()

    def _iter_slices(self) -> Iterator[list[int]]:
        """Cut every full batch into ``num_processes`` slices and yield this process's one."""
        size: int = self.batch_size  # type: ignore[assignment]
        step = size // self.num_processes
        lo, hi = step * self.process_index, step * (self.process_index + 1)
        first: list[int] | None = None
        last: list[int] = []
        for batch in self.batch_sampler:
            if first is None:
                first = list(batch)
            if len(batch) == size:
                yield batch[lo:hi]
            last = batch
        if self.drop_last or first is None or len(last) == size:
            return
        if not self.even_batches:
            if len(last) > lo:
                yield last[lo:hi]
            return
        filler = first
        while len(filler) < size:  # datasets smaller than one batch
            filler = filler + filler
        yield (list(last) + filler)[lo:hi]

    def _iter_whole_batches(self) -> Iterator[list[int]]:
        """Deal whole batches round-robin; yield a round only once it is complete."""
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        keep_head = not self.drop_last and self.even_batches
        head: list[list[int]] = []  # the first n batches, to complete the last round
        mine: list[int] | None = None
        last: list[int] = []
        count = 0
        for idx, batch in enumerate(self.batch_sampler):
            if keep_head and idx < n:
                head.append(batch)
            if idx % n == rank:
                mine = batch
            if idx % n == n - 1 and (size is None or len(batch) == size):
                yield mine  # type: ignore[misc]
                mine = None
            last, count = batch, idx + 1
        if self.drop_last or count == 0:
            return
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine is not None and (size is None or len(mine) == size):
            yield mine
        yield from self._complete_last_round(head, last, count)

    def _complete_last_round(
        self, head: list[list[int]], last: list[int], count: int
    ) -> Iterator[list[int]]:
        """Fill the missing batches (and the short last one) with indices from the start."""
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        if size is None:
            pool: list[Any] = list(head)
            while len(pool) < n:
                pool += pool
            idx, cursor = count, 0
            while idx % n != 0:
                if idx % n == rank:
                    yield pool[cursor]
                cursor, idx = cursor + 1, idx + 1
            return
        flat = [i for batch in head for i in batch]
        while len(flat) < n * size:
            flat += flat
        partial: list[int] = [] if len(last) == size else list(last)
        idx = count if len(last) == size else count - 1
        cursor = 0
        while idx % n != 0 or partial:
            need = size - len(partial)
            batch = partial + flat[cursor : cursor + need]
            if idx % n == rank:
                yield batch
            cursor, idx, partial = cursor + need, idx + 1, []


def get_sampler(dataloader: Any) -> Sampler[Any] | None:
    """Return the index sampler inside a dataloader (below its batch sampler), if any."""
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)


@contextlib.contextmanager
def override_even_batches(
    loaders: Iterable[Any], even_batches: bool | None, *, several: bool
) -> Iterator[None]:
    """Set the loaders' batch samplers' ``even_batches`` inside the block (None: leave them).

    A loader of an iterable dataset has no such sampler and keeps its own; with `several`
    processes that is said with a warning, as Accelerate's ``join_uneven_inputs`` does.
    """
    restore: list[tuple[Any, bool]] = []
    if even_batches is not None:
        skipped = False
        for loader in loaders:
            sampler: Any = getattr(loader, "batch_sampler", None)
            if hasattr(sampler, "even_batches"):
                restore.append((sampler, sampler.even_batches))
                sampler.even_batches = even_batches
            else:
                skipped = True
        if skipped and several:
            warnings.warn(
                "Overriding even_batches is only supported for map-style datasets, yet some "
                "dataloaders given were iterable. (hasten: an iterable dataset's loader keeps "
                "its own even_batches.)",
                UserWarning,
                stacklevel=4,
            )
    try:
        yield
    finally:
        for sampler, value in restore:
            sampler.even_batches = value

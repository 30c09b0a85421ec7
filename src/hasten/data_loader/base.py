"""What every prepared dataloader shares: end-of-data signalling, epochs and mid-epoch resume.

The prepared loaders subclass `torch.utils.data.DataLoader` itself, so ``isinstance(dl,
DataLoader)`` holds without tricks. With ``use_stateful_dataloader=True`` the same class is
combined with torchdata's ``StatefulDataLoader`` (a subclass built once, on first use).

Resume without torchdata: `state_dict()` records the epoch, how many batches the user has
received and the RNG states at the start of the epoch; after `load_state_dict()` the next
iteration rebuilds the same order (same sampler generator, same worker seed), skips the
consumed batches at the index level (no data is loaded for them) and hands back the global
RNG exactly as it was at load time, so a resumed run draws the same random numbers as an
uninterrupted one.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from itertools import islice
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from hasten.core.imports import require
from hasten.core.nested import send_to_device
from hasten.data_loader.iterable import IterableDatasetShard
from hasten.data_loader.pipeline_rng import (
    GlobalRngState,
    PipelineRng,
    capture_global_rng,
    restore_global_rng,
)
from hasten.data_loader.samplers import get_sampler
from hasten.data_loader.world_size import (
    adopt_saved_generator,
    loader_processes,
    rescale_position,
)
from hasten.state import GradientState

__all__ = [
    "DataLoaderAdapter",
    "DataLoaderStateMixin",
    "ResumableDataLoader",
    "dataloader_kwargs",
]

# Constructor arguments that a rebuilt loader takes over from the original one. The sampling
# arguments are left out: the shard supplies its own (batch) sampler.
_SAMPLING_ARGS = frozenset({"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})


@functools.cache
def _dataloader_defaults() -> dict[str, Any]:
    params = inspect.signature(DataLoader.__init__).parameters
    return {
        name: p.default
        for name, p in params.items()
        if name not in ("self", "dataset") and p.default is not inspect.Parameter.empty
    }


def dataloader_kwargs(dataloader: DataLoader[Any]) -> dict[str, Any]:
    """Return the non-sampling constructor arguments of ``dataloader`` (to rebuild it)."""
    return {
        name: getattr(dataloader, name, default)
        for name, default in _dataloader_defaults().items()
        if name not in _SAMPLING_ARGS
    }


class _SkipOnce(Sampler[Any]):
    """Index sampler that drops its first ``skip`` items on the first pass that is read."""

    def __init__(self, sampler: Iterable[Any], skip: int) -> None:
        self.sampler = sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        # A generator, so nothing happens until the first index is read: worker-based
        # iterators call iter() twice before reading, and the skip belongs to the pass read.
        skip, self.skip = self.skip, 0
        yield from islice(iter(self.sampler), skip, None)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


class _NotedIndices(Sampler[Any]):
    """Index sampler that notes the pipeline's generator states before each batch is loaded."""

    def __init__(self, sampler: Any, pipeline: PipelineRng, resume: dict[str, Any] | None) -> None:
        self.sampler = sampler
        self.pipeline = pipeline
        self.resume = resume

    def __iter__(self) -> Iterator[Any]:
        return self.pipeline.indices(self.sampler, self.resume)

    def __len__(self) -> int:
        return len(self.sampler)


class _Progress:
    """Where the current iteration stands, updated once per batch.

    ``position`` is None between epochs, k >= 0 once k batches of the epoch were handed out,
    and -1 once the last batch of the epoch was handed out.
    """

    __slots__ = ("position",)

    def __init__(self) -> None:
        self.position: int | None = None


class DataLoaderStateMixin:
    """Track where the current iteration stands and tell `GradientState` about it.

    Attributes:
        end_of_dataloader: True once the last batch of the epoch has been handed out.
        remainder: samples in the last global batch (-1 when unknown or with ``drop_last``);
            gather_for_metrics uses it to drop the samples that even_batches duplicated.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    _drop_last: bool = False

    @property
    def gradient_state(self) -> GradientState:
        """The shared `GradientState` (looked up, not stored, so loaders stay picklable)."""
        return GradientState()

    def reset(self) -> None:
        """Forget the end-of-data flag and remainder of the previous iteration."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Register this loader as the active one and compute the expected remainder."""
        self.reset()
        if not self._drop_last:
            with suppress(Exception):  # unsized datasets simply have no known remainder
                self.remainder = self._dataset_length() % self.total_batch_size  # type: ignore[attr-defined]
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """Unregister this loader from `GradientState`."""
        self.gradient_state._remove_dataloader(self)

    def _dataset_length(self) -> int:
        dataset = self.dataset  # type: ignore[attr-defined]
        if hasattr(dataset, "total_dataset_length"):
            return int(dataset.total_dataset_length)
        if isinstance(dataset, IterableDatasetShard):
            dataset = dataset.dataset
        return len(dataset)


def _rebuild(base: type, state: dict[str, Any]) -> Any:
    """Unpickle a loader whose class was built at runtime (the stateful variants)."""
    obj: Any = object.__new__(_stateful_variant(base))
    obj.__dict__.update(state)
    return obj


class _StatefulMixin:
    """Resume through torchdata's ``StatefulDataLoader`` instead of our own bookkeeping."""

    _base_class: type
    _dl_state: dict[str, Any] | None = None

    def _snapshot(self) -> None:
        # The base iterator runs one batch ahead; record its state before each fetch so the
        # saved state matches what the user has received, not what was prefetched.
        self._dl_state = self._torchdata_state_dict()

    def _on_round_start(self) -> None:
        self._snapshot()  # DataLoaderDispatcher: once per round, on the main process

    def _fetcher(self, iterator: Iterator[Any]) -> Callable[[], Any]:
        snapshot, fetch = self._snapshot, iterator.__next__

        def fetch_after_snapshot() -> Any:
            snapshot()
            return fetch()

        return fetch_after_snapshot

    def _torchdata_state_dict(self) -> dict[str, Any]:
        return self._stateful_base().state_dict(self)

    @staticmethod
    def _stateful_base() -> Any:
        require(
            "torchdata",
            feature="use_stateful_dataloader=True",
            extra="stateful",
            min_version="0.8.0",
        )
        # optional: torchdata
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader

    def state_dict(self) -> dict[str, Any]:
        """Return torchdata's state of the batches handed out so far."""
        state = dict(self._dl_state) if self._dl_state is not None else {}
        if not state:
            state = self._torchdata_state_dict()
        state["_iterator_finished"] = bool(getattr(self, "end_of_dataloader", False))
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the next iteration from a state returned by `state_dict`."""
        self._stateful_base().load_state_dict(self, state_dict)
        self._dl_state = None

    def _start_epoch(self) -> tuple[int, GlobalRngState | None]:
        self._sync_rng()  # type: ignore[attr-defined]
        self.set_epoch(self.iteration)  # type: ignore[attr-defined]
        return self.skip_batches, None  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(self.__dict__)
        state["_iterator"] = None  # a live torchdata iterator cannot be pickled; state is enough
        return (_rebuild, (self._base_class, state))


@functools.cache
def _stateful_variant(base: type) -> type:
    """Build (once) ``base`` combined with torchdata's ``StatefulDataLoader``."""
    stateful = _StatefulMixin._stateful_base()
    name = f"Stateful{base.__name__}"
    return type(
        name, (_StatefulMixin, base, stateful), {"__module__": base.__module__, "_base_class": base}
    )


class _ChoosesStatefulVariant:
    """Picks the torchdata-backed variant of the class at construction.

    A base of its own, so that `inspect.signature` of the loaders shows their ``__init__``,
    and so that unpickling (which calls ``__new__`` without arguments) works.
    """

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        if use_stateful_dataloader and not issubclass(cls, _StatefulMixin):
            cls = _stateful_variant(cls)  # type: ignore[arg-type]
        return super().__new__(cls)


class _instance_attribute(property):  # lower case: used as a decorator, like property
    """A property read on instances only: on the class it raises AttributeError.

    Accelerate sets ``base_dataloader`` in ``__init__``, so ``DataLoaderShard.base_dataloader``
    is an AttributeError there (its test_dataloader_inheritance checks it); hasten computes it
    without storing ``self`` on ``self`` (no reference cycle).
    """

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            name = getattr(self.fget, "__name__", "attribute")
            owner = objtype.__name__ if objtype is not None else "class"
            raise AttributeError(f"type object {owner!r} has no attribute {name!r}")
        return super().__get__(obj, objtype)


class DataLoaderAdapter(_ChoosesStatefulVariant, DataLoader[Any], DataLoaderStateMixin):
    """A `DataLoader` that knows its epoch and position and can resume mid-epoch.

    Accelerate's ``DataLoaderAdapter``: with ``use_stateful_dataloader=True`` the object is a
    torchdata ``StatefulDataLoader`` too. Where Accelerate wraps a loader, hasten's *is* one,
    so `base_dataloader` is the object itself.

    Args:
        dataset: the dataset to load from.
        use_stateful_dataloader: back this loader with torchdata's ``StatefulDataLoader``.
        batch_sampler: forwarded to `DataLoader`.
        **kwargs: forwarded to `DataLoader`, except two read here: ``skip_batches`` (batches to
            skip at the start of every iteration) and ``iteration`` (the epoch to start from).
    """

    def __init__(
        self,
        dataset: Any,
        use_stateful_dataloader: bool = False,
        batch_sampler: Any = None,
        **kwargs: Any,
    ) -> None:
        skip_batches = int(kwargs.pop("skip_batches", 0))
        iteration = int(kwargs.pop("iteration", 0))
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.use_stateful_dataloader = use_stateful_dataloader
        self.skip_batches = skip_batches
        self.iteration = iteration
        self._skip_indices = 0
        self._progress = _Progress()
        self._epoch_rng: dict[str, torch.Tensor] | None = None
        self._resume: dict[str, Any] | None = None
        self._pipeline = PipelineRng(self.num_workers)
        self._note_indices: tuple[dict[str, Any] | None] | None = None
        self._give_back: torch.Generator | None = None

    @_instance_attribute
    def base_dataloader(self) -> DataLoader[Any]:
        """The torch `DataLoader` doing the loading: this object itself (Accelerate's wrapped one)."""
        return self

    @property
    def _position(self) -> int | None:
        return self._progress.position

    @_position.setter
    def _position(self, position: int | None) -> None:
        self._progress.position = position

    # -- index-level skipping --------------------------------------------------------------

    @property
    def _index_sampler(self) -> Any:
        # DataLoader's iterators read this once when created; handing them a sampler that
        # drops the first indices skips batches without loading their data.
        sampler = self.batch_sampler if self._auto_collation else self.sampler
        skip, self._skip_indices = self._skip_indices, 0
        sampler = _SkipOnce(sampler, skip) if skip else sampler  # type: ignore[arg-type]
        note, self._note_indices = self._note_indices, None
        if note is not None:  # read by the iterator being made: note the pipeline's states
            return _NotedIndices(sampler, self._pipeline, note[0])
        return sampler

    def _base_iterator(self, skip: int) -> Iterator[Any]:
        """Create the underlying iterator, already past the first ``skip`` batches."""
        if skip and not isinstance(self.dataset, IterableDataset):
            self._skip_indices = skip
            return super().__iter__()
        iterator = super().__iter__()
        for _ in range(skip):  # an iterable dataset has no indices: read and drop
            if next(iterator, _END) is _END:
                break
        return iterator

    def _fetcher(self, iterator: Iterator[Any]) -> Callable[[], Any]:
        return iterator.__next__

    def _tracks_pipeline(self) -> bool:
        """Whether this loader records its pipeline's random streams (see `pipeline_rng`).

        Not with torchdata (it keeps its own worker states) and not with persistent workers
        (they are not reseeded per epoch; `load_pipeline_state` warns).
        """
        return not self.use_stateful_dataloader and not (
            self.num_workers > 0 and self.persistent_workers
        )

    def _pipeline_iterator(self, skip: int) -> Callable[[], Any]:
        """The batch fetch of an iteration past ``skip`` batches, noting the random streams."""
        if not self._tracks_pipeline():
            return self._fetcher(self._base_iterator(skip))
        pipeline = self._pipeline
        resume = pipeline.begin(skip + self._offset)
        if self.num_workers == 0:
            self._note_indices = (resume,)
            return self._fetcher(self._base_iterator(skip))
        collate, init = self.collate_fn, self.worker_init_fn
        self.collate_fn = pipeline.collate(collate)
        self.worker_init_fn = pipeline.worker_init(init)
        try:  # the iterator takes both when it is made (and its workers start)
            iterator = self._base_iterator(skip)
        finally:
            self.collate_fn, self.worker_init_fn = collate, init
        return self._fetcher(iter(_Unwrapped(pipeline.unwrap(iterator.__next__))))

    # -- iteration ---------------------------------------------------------------------------

    # Set by Accelerator.load_state(keep_global_batch=True): a load by
    # another number of processes then keeps the global batch (the accelerator scales
    # gradient accumulation), so the rescaled position is not warned about.
    keep_global_batch = False
    saved_processes: int | None = None  # processes that saved the last loaded state

    _move_to: Any = None  # DataLoaderShard: the device batches go to (None: no move)
    # Set by an upper layer (checkpointing's preemption watcher) to run between two batches,
    # once the step on the previous batch is complete; None costs one check per batch.
    batch_boundary_hook: Callable[[], None] | None = None

    def _boundary_hook(self) -> Callable[[], None] | None:
        """This epoch's batch-boundary hook; None when processes may get different batch counts.

        With ``even_batches=False`` one process can have a batch more than another, so a hook
        that runs a collective per batch would pair up with the wrong operation.
        """
        hook = ResumableDataLoader.batch_boundary_hook
        if hook is None:
            return None
        for holder in (self.batch_sampler, self.sampler):
            while holder is not None:
                if getattr(holder, "even_batches", True) is False:
                    return None
                holder = getattr(holder, "batch_sampler", None)  # SkipBatchSampler wraps one
        return hook

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        skip, restore_rng = self._start_epoch()
        self.begin()
        try:
            fetch = self._pipeline_iterator(skip)
            try:
                current = fetch()
            except StopIteration:
                self._position = None
                return
            if restore_rng is not None:
                restore_global_rng(restore_rng)
            if self._give_back is not None:  # the saved epoch's order is drawn: own one again
                get_sampler(self).generator, self._give_back = self._give_back, None  # type: ignore[union-attr]
            # The per-batch loop, kept in this frame (no `yield from`): read one batch ahead
            # to know, when handing out a batch, whether it is the last one.
            position = skip + self._offset
            device, non_blocking = self._move_to, getattr(self, "_non_blocking", False)
            progress = self._progress  # a slotted cell: cheaper than DataLoader.__setattr__
            boundary = self._boundary_hook()
            while True:
                if device is not None:
                    current = send_to_device(current, device, non_blocking=non_blocking)
                try:
                    upcoming = fetch()
                except StopIteration:
                    break
                position += 1
                progress.position = position
                yield current
                if boundary is not None:
                    boundary()
                current = upcoming
            self.end_of_dataloader = True
            progress.position = -1
            yield current
            self.iteration += 1
            self._position = None
        finally:
            self.end()

    # -- epochs and RNG ----------------------------------------------------------------------

    def _sync_rng(self) -> None:
        """Hook: align RNGs across processes at the start of an epoch (see DataLoaderShard)."""

    def _generators(self) -> dict[str, torch.Generator]:
        found: dict[str, torch.Generator] = {}
        sampler = get_sampler(self)
        for key, gen in (
            ("loader", self.generator),
            ("sampler", getattr(sampler, "generator", None)),
            ("synchronized", getattr(self, "synchronized_generator", None)),
        ):
            if isinstance(gen, torch.Generator) and all(gen is not g for g in found.values()):
                found[key] = gen
        return found

    def _capture_epoch_rng(self) -> None:
        states = {f"{k}_generator": g.get_state() for k, g in self._generators().items()}
        states["torch"] = torch.get_rng_state()
        self._epoch_rng = states
        if self._origin is not None:
            self._origin._epoch_rng = states

    def _start_epoch(self) -> tuple[int, GlobalRngState | None]:
        """Prepare an iteration; return (batches to skip, global RNG states to restore)."""
        resume, self._resume = self._resume, None
        if self._origin is not None:
            resume = self._adopt_origin(resume)
        if resume is None:
            self._sync_rng()
            self.set_epoch(self.iteration)
            self._capture_epoch_rng()
            return self.skip_batches, None
        current = capture_global_rng()
        rng = resume.get("rng", {})
        self._give_back = adopt_saved_generator(get_sampler(self), rng)
        for key, gen in self._generators().items():
            if f"{key}_generator" in rng:
                gen.set_state(rng[f"{key}_generator"])
        epoch_torch = (self._pipeline.pending or {}).get("torch_epoch", rng.get("torch"))
        if epoch_torch is not None:  # this process's own, when its pipeline state was loaded
            torch.set_rng_state(epoch_torch)
        self.set_epoch(self.iteration)
        self._capture_epoch_rng()
        return int(resume["batches_yielded"]) or self.skip_batches, current

    # -- skip copies -------------------------------------------------------------------------

    _origin: ResumableDataLoader | None = None  # the loader a skip_first_batches copy continues
    _offset = 0  # batches the copy's batch sampler drops before this loader counts any

    def _follow(self, origin: ResumableDataLoader, offset: int) -> None:
        """Make this `skip_first_batches` copy continue ``origin``'s epochs.

        A position loaded into ``origin`` is replayed here (same order and RNG; the copy's own
        skip replaces the saved count, so nothing is skipped twice), and ``origin.state_dict()``
        reports the copy's progress, so a checkpoint taken while iterating the copy resumes.
        """
        self._origin, self._offset, self._progress = origin, offset, origin._progress
        self._pipeline = origin._pipeline

    def _adopt_origin(self, resume: dict[str, Any] | None) -> dict[str, Any] | None:
        origin = self._origin
        assert origin is not None  # noqa: S101 - only called for skip copies
        if resume is None and origin._resume is not None:  # loaded after the copy was made
            resume = origin._take_resume()
            assert resume is not None  # noqa: S101
            self.iteration = int(resume["epoch"])
            resume = dict(resume, batches_yielded=0)
        origin.iteration = self.iteration  # origin.state_dict() reports the copy's epoch
        return resume

    def end(self) -> None:
        """Unregister from `GradientState`; a skip copy hands its epoch count to its origin."""
        super().end()
        if self._origin is not None:
            self._origin.iteration = self.iteration

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of this loader, its (batch) sampler and dataset when they listen."""
        self.iteration = epoch
        batch_sampler: Any = self.batch_sampler
        if hasattr(batch_sampler, "set_epoch"):
            batch_sampler.set_epoch(epoch)
        sampler: Any = get_sampler(self)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        elif hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    # -- resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the epoch and number of batches handed out, enough to resume exactly."""
        if self._resume is not None:  # loaded but not iterated yet
            return dict(self._resume)
        position = self._position
        if position is None:
            return {"epoch": self.iteration, "batches_yielded": 0}
        if position < 0:
            return {"epoch": self.iteration + 1, "batches_yielded": 0}
        state: dict[str, Any] = {"epoch": self.iteration, "batches_yielded": position}
        state["num_processes"], state["split_batches"] = loader_processes(self)
        if position and self._epoch_rng is not None:
            state["rng"] = dict(self._epoch_rng)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Make the next iteration continue where the saved one stopped.

        Raises:
            ValueError: ``state_dict`` lacks the ``epoch`` / ``batches_yielded`` keys.
        """
        if "epoch" not in state_dict or "batches_yielded" not in state_dict:
            raise ValueError(
                f"Not a dataloader state: expected the keys 'epoch' and 'batches_yielded', "
                f"got {sorted(state_dict)!r}. Pass what this loader's state_dict() returned."
            )
        self.iteration = int(state_dict["epoch"])
        self._position = None
        now, split = loader_processes(self)
        self.saved_processes = int(state_dict.get("num_processes", now))
        position = rescale_position(state_dict, now, split, self.keep_global_batch)
        self._resume = dict(state_dict, batches_yielded=position) if position else None

    def pipeline_state(self) -> dict[str, Any] | None:
        """This process's data-pipeline random streams at the current position (None between
        epochs): saved per process, beside its RNG states, by `save_state`."""
        if self._resume is not None:  # loaded but not iterated yet: what was loaded
            return self._pipeline.pending
        position = self._position
        if not position or position < 0 or not self._tracks_pipeline():
            return None
        state = self._pipeline.state(position)
        if self._epoch_rng is not None:
            state["torch_epoch"] = self._epoch_rng["torch"]
        return state

    def load_pipeline_state(self, state: dict[str, Any] | None) -> None:
        """Make the next iteration redraw what the saved one drew (see `pipeline_state`)."""
        if state is not None and not self._tracks_pipeline():
            warnings.warn(
                "This loader's data pipeline random streams are not restored (persistent workers "
                "or torchdata keep their own): random transforms and collators will not draw what "
                "the saved run drew. Use persistent_workers=False for an exact resume.",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self._pipeline.pending = state

    def _take_resume(self) -> dict[str, Any] | None:
        """Hand a loaded-but-unused resume point over to a copy (see `skip_first_batches`).

        The copy finishes the interrupted epoch; this loader moves on to the next one.
        """
        resume, self._resume = self._resume, None
        if resume is None:
            return None
        self.iteration = int(resume["epoch"]) + 1
        return resume

    # -- samplers ----------------------------------------------------------------------------

    @property
    def total_batch_size(self) -> int:
        """Samples in one step across all processes."""
        dataset = self.dataset
        if isinstance(dataset, IterableDatasetShard):
            if dataset.split_batches:
                return dataset.batch_size
            return dataset.batch_size * dataset.num_processes
        source = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        size = int(source.batch_size)  # type: ignore[union-attr]
        if getattr(source, "split_batches", False):
            return size
        return size * getattr(source, "num_processes", 1)

    @property
    def total_dataset_length(self) -> int:
        """Length of the whole dataset (all processes together)."""
        if hasattr(self.dataset, "total_length"):
            return int(self.dataset.total_length)
        return len(self.dataset)  # type: ignore[arg-type]

    def get_sampler(self) -> Sampler[Any] | None:
        """Return the index sampler below the batch sampler."""
        return get_sampler(self)

    def set_sampler(self, sampler: Sampler[Any]) -> None:
        """Replace the index sampler below the batch sampler(s)."""
        # Shard and skip samplers forward `.sampler` to the batch sampler they wrap.
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        holder.sampler = sampler  # type: ignore[union-attr]


_END = object()


class _Unwrapped:
    """An iterator over what ``fetch`` returns (worker batches without their RNG notes)."""

    def __init__(self, fetch: Callable[[], Any]) -> None:
        self.fetch = fetch

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.fetch()


# The name hasten's loaders were built on before Accelerate's was adopted.
ResumableDataLoader = DataLoaderAdapter

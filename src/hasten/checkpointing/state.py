"""save_state / load_state on disk: every process's share, written crash-safely, verified on load.

A checkpoint is written into a hidden staging folder beside its final name; each file is fsynced
as it is written, then the main process writes the manifest (sizes and block checksums of every
file from every process) and renames the folder into place. A crash at any moment leaves the previous
checkpoints untouched and at most a staging folder that nothing will load.

`save_contents` / `load_contents` write and read what every checkpoint has (schedulers, data
loaders, custom objects, the scaler, each process's RNG states), then hand the models and
optimizers to the contents' layout (`hasten.checkpointing.layouts`).

Exact resume: a checkpoint holds, besides models, optimizers, schedulers, scaler and custom
objects, each process's RNG states and accumulated (not yet stepped) gradients, the
accumulation counter, and every prepared loader's epoch, position and epoch-start generator
states. After `load_accelerator_state` both conventions continue bit for bit: iterating the
loaded loader resumes at the saved position, and ``skip_first_batches(loader, n)`` (Accelerate's
way, n = batches this process consumed in the epoch) replays the saved epoch's order and skips n
(not n twice); the loader then goes on with the next epoch as the uninterrupted run would.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hasten.checkpointing.layouts.base import (
    CheckpointContents,
    CheckpointLayout,
    LayoutLoad,
    LayoutSave,
    StagedT,
    warn_or_raise,
)
from hasten.checkpointing.layouts.factory import default_layout
from hasten.checkpointing.rng import (
    capture_rng_state,
    has_saved_rng_state,
    load_pipeline_states,
    pipeline_state_of,
    restore_rng_state,
)
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.agreement import (
    agree_on_outcome,
    background_comm,
    missing_files,
    next_token,
)
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, read_manifest
from hasten.checkpointing.storage.reader import CheckpointReader, PendingRead
from hasten.checkpointing.storage.transaction import save_transaction
from hasten.checkpointing.storage.writer import (
    FileJob,
    HostBuffers,
    LayoutWritten,
    PendingSave,
    SavePlan,
    SaveTarget,
    Snapshot,
    pickle_job,
)
from hasten.core.errors import CheckpointNotFoundError
from hasten.state import PartialState, recorder

__all__ = [
    "CheckpointContents",
    "finish_async_save",
    "load_contents",
    "save_contents",
]


logger = logging.getLogger(__name__)


def save_contents(
    output_dir: str | os.PathLike[str],
    contents: CheckpointContents,
    *,
    layout: CheckpointLayout[Any] | None = None,
    step: int = 0,
    safe_serialization: bool = True,
    save_on_each_node: bool = False,
    async_save: bool = False,
    total_limit: int | None = None,
    project_dir: str | None = None,
    host_buffers: HostBuffers | None = None,
    pre_hooks: Callable[[Path], None] | None = None,
) -> Path | PendingSave:
    """Write a complete checkpoint of ``contents`` to ``output_dir`` on every process together.

    Every process must call this. ``layout`` writes the models and optimizers (None: the
    replicated layout over the base strategy, Accelerate's positional
    ``save_accelerator_state``). Synchronously it returns the final folder once it is
    published everywhere. With ``async_save`` it returns a `PendingSave` as soon as the state is
    copied to host memory; the files are written and published on a background thread.
    ``total_limit`` (with ``project_dir``) prunes the oldest automatic checkpoints after publishing.
    ``host_buffers`` (async only) are reused from the previous asynchronous save.
    ``pre_hooks`` (the user's save-state pre-hooks) run on every process with the staging folder
    before anything is written: the files they leave there are published with the checkpoint
    (and listed in its manifest), and model states they remove are not saved.
    """
    layout = layout if layout is not None else default_layout()
    state = PartialState()
    token = next_token()  # every process, first: the save's name and staging folder
    buffers = (host_buffers or HostBuffers()) if async_save else None
    if buffers is not None:
        buffers.begin()
    target = SaveTarget(
        final=Path(output_dir).absolute(),
        rank=state.process_index,
        num_processes=state.num_processes,
        token=token,
        attributes={"step": step, "num_processes": state.num_processes},
        total_limit=total_limit,
        project_dir=project_dir,
    )
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    plan = SavePlan(target, is_writer=writer)
    # Optimizer states are copied on the writer thread; their next step waits for that copy.
    deferred = Snapshot(buffers) if buffers is not None else None
    save = LayoutSave(plan, contents, safe_serialization, buffers, deferred)
    one_folder = layout.needs_one_folder
    with save_transaction(
        plan, one_folder=one_folder, save_on_each_node=save_on_each_node
    ) as transaction:
        planned = False
        staged: object = None
        try:
            if pre_hooks is not None and plan.failure is None:
                # the user's save pre-hooks write into the staging folder: their files are
                # published with the checkpoint (listed by the folder's owner), and model
                # states they remove are not saved
                pre_hooks(plan.staging)
                plan.adopt_unlisted = True
            if plan.failure is None:
                staged = _plan_jobs(save, layout, step)
                planned = True
        except Exception as exc:  # noqa: BLE001 - the agreement tells every process, then raises
            if one_folder is not None:
                raise
            plan.failure, plan.jobs = exc, []
        if buffers is not None:
            buffers.finish()  # device copies landed: training may change the originals now
        recorder.note(f"save_state: writing {_names(plan)} into {plan.staging}")
        # collective: DCP, or the engine's own save
        written = layout.write(save, staged) if planned else LayoutWritten()
        before = None
        if isinstance(written, LayoutWritten):
            plan.written = written
        else:
            before = written  # an asynchronous write, run on the writer thread
        if async_save:  # the agreement runs on the writer thread, over a group of its own
            return transaction.publish_later(background_comm(buffers), deferred, before)
        return transaction.publish()


def _plan_jobs(save: LayoutSave, layout: CheckpointLayout[StagedT], step: int) -> StagedT:
    """The files this process writes: the layout's, the other shared ones (if it is a
    writer), then its RNG states; returns what the layout's write needs."""
    plan = save.plan
    staged = layout.plan(save)
    if plan.is_writer:
        shared = _shared_jobs(save.contents, save.copy)
        plan.jobs += shared
        plan.shared_names += [job.name for job in shared]
    rng = {**capture_rng_state(), "step": step}
    # each process's data pipeline streams (random transforms, collators, workers) are its own
    rng["dataloaders"] = [pipeline_state_of(d) for d in save.contents.dataloaders]
    plan.jobs.append(pickle_job(paths.rng_file(plan.rank), rng))
    return staged


def _shared_jobs(contents: CheckpointContents, copy: Callable[[Any], Any]) -> list[FileJob]:
    """The files every process reads besides models and optimizers: schedulers, loaders,
    custom objects, the scaler."""
    jobs = [
        pickle_job(paths.scheduler_file(i), copy(s.state_dict()))
        for i, s in enumerate(contents.schedulers)
    ]
    jobs += [
        pickle_job(paths.dataloader_state_file(i), copy(d.state_dict()))
        for i, d in enumerate(contents.dataloaders)
        if hasattr(d, "state_dict")
    ]
    jobs += [
        pickle_job(paths.custom_object_file(i), copy(c.state_dict()))
        for i, c in enumerate(contents.custom_objects)
    ]
    if contents.scaler is not None:
        jobs.append(pickle_job(paths.scaler_file(), copy(contents.scaler.state_dict())))
    return jobs


def _names(plan: SavePlan) -> str:
    """The files this process writes, for the hang recorder's report."""
    names = [job.name for job in plan.jobs]
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def finish_async_save(pending: PendingSave) -> Path:
    """Wait for an asynchronous save on every process together; return the published folder.

    The writer publishes only after every process has written its share, so a process whose
    own part is done waits here until the folder exists everywhere (and learns if any process
    failed) before it may load or save again. Every process must call this.
    """
    error: BaseException | None = None
    try:
        pending.wait()
    except Exception as exc:  # noqa: BLE001 - every process learns the outcome, then raises
        error = exc
    agree_on_outcome(error)
    if error is not None:
        raise error
    return pending.plan.final


def _open_manifest(folder: Path, strict: bool) -> dict[str, Any] | None:
    if not folder.is_dir():
        raise CheckpointNotFoundError(
            f"No checkpoint folder at {folder}. Pass the folder that save_state wrote, or call "
            "load_state() without arguments to load the newest complete automatic checkpoint."
        )
    try:
        return read_manifest(folder)
    except CorruptCheckpointError as exc:
        if strict:
            raise
        warnings.warn(f"{exc} Loading without verification.", RuntimeWarning, stacklevel=4)
        return None


def load_contents(
    input_dir: str | os.PathLike[str],
    contents: CheckpointContents,
    *,
    layout: CheckpointLayout[Any] | None = None,
    map_location: str | torch.device = "cpu",
    strict: bool = True,
) -> dict[str, Any]:
    """Restore ``contents`` from a checkpoint; return the saved attributes (``{"step": ...}``).

    ``layout`` reads the models and optimizers, as the disk says (None: the replicated layout
    over the base strategy).

    Every process must call this: they agree on the outcome, so a process that cannot load
    makes every other one raise too (naming it), instead of leaving them to wait for it in the
    next collective.

    Raises:
        CheckpointNotFoundError: (a ValueError, as in Accelerate, and a FileNotFoundError)
            ``input_dir`` does not exist, or lacks files this process needs (the processes
            did not share one folder when saving: the message says where they were written).
        CorruptCheckpointError: partial or damaged checkpoint (names the file).
        ValueError: a different model or a different number of prepared/registered objects.
        RuntimeError: a part (RNG, sampler, scaler, custom object, ...) could not be restored;
            with ``strict=False`` each such part warns instead; or another process could not
            load.
    """
    recorder.note(f"load_state: reading {Path(input_dir).absolute()}")
    error: Exception | None = None
    try:
        chosen = layout if layout is not None else default_layout()
        attributes = _load_contents(Path(input_dir), contents, chosen, map_location, strict)
    except Exception as exc:  # noqa: BLE001 - every process learns the outcome, then raises
        error = exc
    try:
        agree_on_outcome(error, "The checkpoint was not loaded")
    finally:
        recorder.note(None)
    if error is not None:
        raise error
    return attributes


def _load_contents(
    folder: Path,
    contents: CheckpointContents,
    layout: CheckpointLayout[Any],
    map_location: str | torch.device,
    strict: bool,
) -> dict[str, Any]:
    manifest = _open_manifest(folder, strict)
    if manifest is not None:
        missing = missing_files(folder, manifest, PartialState().process_index)
        if missing is not None:
            raise CheckpointNotFoundError(missing)
    with CheckpointReader(folder, manifest) as files:
        # Every file is parsed and queued first, so parsing one overlaps reading the others;
        # each is applied only once all its blocks are read and verified.
        finish = layout.load(LayoutLoad(files, contents, map_location, strict))
        parts = [
            (part, target, _start_part(files, name, map_location))
            for part, name, target in _stateful_parts(contents)
        ]
        finish()  # the layout's models and optimizers are in place
        for part, target, started in parts:
            try:
                if isinstance(started, BaseException):
                    raise started
                target.load_state_dict(started.result())
            except CorruptCheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001 - named and re-raised, or warned if non-strict
                warn_or_raise(part, exc, strict)
        return {"step": _load_rng(files, _read_rng(files), strict, contents.dataloaders)}


def _start_part(
    files: CheckpointReader, name: str, where: str | torch.device
) -> PendingRead | Exception:
    """Start loading one stateful part; a failure is returned, to be raised in its turn."""
    try:
        return files.start_unpickle(name, where)
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported in order by load_contents
        return exc


def _stateful_parts(contents: CheckpointContents) -> list[tuple[str, str, Any]]:
    """(name for errors, file, object) of everything besides models and optimizers restored
    through ``load_state_dict``."""
    parts: list[tuple[str, str, Any]] = [
        (f"scheduler {i}", paths.scheduler_file(i), s) for i, s in enumerate(contents.schedulers)
    ]
    parts += [
        (f"dataloader {i}", paths.dataloader_state_file(i), d)
        for i, d in enumerate(contents.dataloaders)
        if hasattr(d, "load_state_dict")
    ]
    parts += [
        (f"custom object {i}", paths.custom_object_file(i), c)
        for i, c in enumerate(contents.custom_objects)
    ]
    if contents.scaler is not None:
        parts.append(("grad scaler", paths.scaler_file(), contents.scaler))
    return parts


def _read_rng(files: CheckpointReader) -> Any:
    """This process's saved RNG states, the exception reading them raised, or {} (resharded)."""
    state = PartialState()
    rank = state.process_index
    if not has_saved_rng_state(
        files.manifest, rank, state.num_processes
    ):  # warns: a process the save did not have
        return {}
    try:
        return files.unpickle(paths.rng_file(rank), "cpu")
    except Exception as exc:  # noqa: BLE001 - raised or warned about by _load_rng
        return exc


def _load_rng(files: CheckpointReader, rng: Any, strict: bool, loaders: list[Any]) -> int:
    """Restore the RNG states `_read_rng` gave (and the loaders' pipeline streams); return the
    saved step."""
    saved_step = int((files.manifest or {}).get("step", 0))
    if isinstance(rng, CorruptCheckpointError):
        raise rng
    if isinstance(rng, Exception):
        warn_or_raise("the RNG states", rng, strict)
        return saved_step
    step = int(rng.pop("step", saved_step))
    load_pipeline_states(loaders, rng.pop("dataloaders", None))
    restore_rng_state(rng, strict=strict)
    return step

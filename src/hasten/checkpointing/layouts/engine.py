"""Models, optimizers and schedulers written and read by the engine itself (DeepSpeed).

`EngineLayout` hands the staging folder to the strategy's engine (`EngineCheckpoint`), whose
every file goes through hasten's writer (`EngineFiles`: hashed while written, fsynced in the
background, or copied to host memory for an asynchronous save); files the engine writes by
itself are checksummed by the main process. On load every engine file is verified against the
manifest before the engine reads any of it, each by a process that reads it anyway
(`EngineReads`), so each file is read once. See docs/checkpoints.md.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hasten.checkpointing.layouts.base import (
    CheckpointContents,
    CheckpointLayout,
    LayoutLoad,
    LayoutSave,
    PreparedObjects,
)
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.agreement import agree_on_outcome
from hasten.checkpointing.storage.engine_files import EngineFiles, EngineReads, files_to_verify
from hasten.checkpointing.storage.manifest import CorruptCheckpointError
from hasten.checkpointing.storage.writer import (
    FileJob,
    LayoutWritten,
    SavePlan,
    start_adopting,
    start_jobs,
)
from hasten.state import PartialState
from hasten.strategies.checkpoints import EngineCheckpoint

__all__ = ["EngineLayout", "load_engine_checkpoint"]


class EngineLayout(CheckpointLayout[None]):
    """The engine writes and reads its models, optimizers and schedulers (see the module).

    Args:
        strategy: the strategy whose engine saves and loads.
    """

    needs_one_folder = "A DeepSpeed checkpoint"

    def __init__(self, strategy: EngineCheckpoint) -> None:
        self.strategy = strategy

    def contents(self, prepared: PreparedObjects, *, for_save: bool) -> CheckpointContents:
        """The data loaders and custom objects: the engine holds models, optimizers and
        schedulers itself. A save inside an accumulation cycle warns."""
        if for_save and prepared.mid_cycle:
            warnings.warn(
                "save_state() in the middle of a DeepSpeed accumulation cycle: DeepSpeed's "
                "checkpoint does not hold the partly accumulated gradients, so after a "
                "resume from it the first update has only the gradients of the micro-"
                "batches that follow. Save when "
                "accelerator.sync_gradients is True (after the optimizer step) for an "
                "exact resume.",
                RuntimeWarning,
                stacklevel=4,
            )
        return CheckpointContents(
            prepared_models=list(prepared.models),
            dataloaders=list(prepared.dataloaders),
            custom_objects=list(prepared.custom_objects),
        )

    def plan(self, save: LayoutSave) -> None:
        """Nothing: the engine writes its files in `write`."""

    def write(self, save: LayoutSave, staged: None) -> LayoutWritten:
        """The engine writes its files through hasten's writer (copies them, when asynchronous).

        Every process's staging folder exists (`require_one_folder` made sure it is the same
        one), so hasten's own files are written beside the engine's from the start. A failure
        to write a file is reported in the agreement every process joins after writing.
        """
        plan, buffers = save.plan, save.buffers
        started = None
        if buffers is not None:
            files = EngineFiles(plan.staging, buffers.copy)
        else:
            files = EngineFiles(plan.staging)
            started = start_jobs(plan.staging, plan.jobs)
        try:
            self.strategy.save_checkpoint(plan.staging, files)
        except BaseException:
            shutil.rmtree(plan.staging, ignore_errors=True)
            raise
        later: list[FileJob] = []
        adopting = []
        if buffers is not None:
            later = [FileJob(name, write) for name, write in files.jobs()]
            buffers.finish()  # device copies of the engine's state landed
        elif plan.is_writer:
            adopting = start_adopting(plan.staging, _engine_written_top_level(plan))
        return LayoutWritten(
            engine_files=files,
            adopt_unlisted=True,
            started=started,
            adopting=adopting,
            later=later,
        )

    def load(self, load: LayoutLoad) -> Callable[[], None]:
        """Verify every engine file on every process, then let the engine load them."""
        files = load.files
        load_engine_checkpoint(self.strategy, files.folder, files.manifest, load.strict)
        return _nothing


def _nothing() -> None:
    """The engine put everything in place while loading."""


def _engine_written_top_level(plan: SavePlan) -> list[str]:
    """Top-level files of the staging folder the engine wrote by itself (DeepSpeed's ``latest``
    and recovery script), told apart from hasten's own: the writer's jobs and every process's
    RNG file, the only ones the other processes write there."""
    own = {job.name for job in plan.jobs} | {
        paths.rng_file(rank) for rank in range(plan.num_processes)
    }
    return [
        entry.name
        for entry in os.scandir(plan.staging)
        if entry.is_file() and not entry.name.startswith(".") and entry.name not in own
    ]


def _agree_on_load(error: BaseException | None) -> None:
    """Every process learns whether any could not verify its engine files (see agree_on_outcome)."""
    try:
        agree_on_outcome(error, "The checkpoint was not loaded")
    except RuntimeError as exc:
        raise CorruptCheckpointError(str(exc)) from exc


def load_engine_checkpoint(
    engine: EngineCheckpoint,
    folder: Path,
    manifest: dict[str, Any] | None,
    strict: bool,
    agree: Callable[[BaseException | None], None] = _agree_on_load,
) -> None:
    """Verify every engine file, then let the engine load them, each file read once.

    Each process checks the files its engine will read (and a share of the rest) and keeps them
    mapped for the engine's loads (`EngineReads`). ``agree(error)`` (a collective: every process
    calls it) raises on every process if any failed, so a damaged file is refused everywhere
    before anything is parsed. A checkpoint of another number of processes than the engine can
    load is refused first, on every process alike (the manifest records the number).

    Raises:
        ValueError: the engine cannot load it on this number of processes (says why).
    """
    saved, processes = (manifest or {}).get("num_processes"), PartialState().num_processes
    reason = None if saved in (None, processes) else engine.refuses_process_count(saved, processes)
    if reason is not None:
        raise ValueError(reason)
    if manifest is None:  # strict=False: nothing to verify against
        engine.load_checkpoint(folder, strict=strict)
        return
    state = PartialState()
    names = [n for n in manifest["files"] if os.sep in n or "/" in n]
    mine = files_to_verify(names, state.process_index, state.num_processes, engine.file_readers)
    with EngineReads(folder, manifest) as files:
        error: BaseException | None = None
        try:
            files.verify(mine)
        except (CorruptCheckpointError, OSError) as exc:
            error = exc
        agree(error)
        if error is not None:
            raise error
        engine.load_checkpoint(folder, strict=strict, files=files)

"""Writing a checkpoint: plan the files, write them (inline or on a thread), publish atomically.

Every process writes its share into the staging folder of the folder it was given, then the
processes agree over the process group on what each wrote and where
(`hasten.checkpointing.storage.agreement`): each folder's owner (the lowest rank writing there) collects
its members' records (size, block checksums), writes the manifest and renames the folder into
place. A background save (``async_save``) agrees over a gloo group of its own, so its collective
never interleaves with the training loop's.
"""

from __future__ import annotations

import errno
import functools
import shutil
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.agreement import SaveAgreement
from hasten.checkpointing.storage.engine_files import (
    EngineFiles,
    engine_file_names,
    hash_existing,
    subdirectories,
)
from hasten.checkpointing.storage.io import (
    EarlyWriteback,
    fsync_directory,
    fsync_path,
)
from hasten.checkpointing.storage.manifest import (
    ChecksumWriter,
    FileRecord,
    manifest_name,
    write_manifest,
)
from hasten.checkpointing.storage.space import disk_full_error, out_of_space
from hasten.checkpointing.storage.tensors import write_safetensors
from hasten.checkpointing.storage.threads import io_threads
from hasten.core.nested import recursively_apply
from hasten.ops.comm import Communicator
from hasten.state import recorder

__all__ = [
    "FileJob",
    "HostBuffers",
    "LayoutWritten",
    "PendingSave",
    "SavePlan",
    "SaveTarget",
    "Snapshot",
    "model_jobs",
    "pickle_job",
    "run_plan",
    "safetensors_job",
    "start_adopting",
    "start_jobs",
    "write_jobs",
]


class HostBuffers:
    """Host memory that successive asynchronous saves copy the training state into.

    The buffers are kept between saves (the previous save has finished writing before the
    next one copies), so after the first save the copy is a plain memcpy without page faults
    or allocation -- that copy is all the training loop waits for. Tensors sharing storage
    (tied weights) share one buffer, so they are still stored once. Device tensors go to
    pinned memory without blocking; `finish` waits for those copies.
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._seen: dict[tuple[Any, ...], torch.Tensor] = {}
        self._pending_device = False
        #: The process group a background sharded save coordinates over (made on first use,
        #: so its collectives never interleave with the training loop's).
        self.group: Any = None

    def begin(self) -> None:
        """Start copying a new checkpoint (reusing the previous one's buffers in order)."""
        self._next = 0
        self._seen = {}

    def copy(self, obj: Any) -> Any:
        """``obj`` with every tensor replaced by its host copy."""
        return recursively_apply(self._copy_tensor, obj)

    def finish(self) -> None:
        """Wait for device-to-host copies still in flight."""
        if self._pending_device:
            torch.cuda.synchronize()
            self._pending_device = False
        self._seen = {}

    def _copy_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        dtensor = _dtensor_type()
        if dtensor is not None and isinstance(tensor, dtensor):
            # a sharded tensor: copy this process's shard, keep its layout (mesh, placements)
            local = self._copy_tensor(tensor._local_tensor)
            return dtensor(local, tensor._spec, requires_grad=False)
        tensor = tensor.detach()
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        shared = self._seen.get(key)
        if shared is not None:
            return shared
        index, self._next = self._next, self._next + 1
        buffer = self._buffers[index] if index < len(self._buffers) else None
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = tensor.device.type == "cuda"
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
            if index < len(self._buffers):
                self._buffers[index] = buffer
            else:
                self._buffers.append(buffer)
        non_blocking = tensor.device.type == "cuda"
        buffer.copy_(tensor, non_blocking=non_blocking)
        self._pending_device |= non_blocking
        self._seen[key] = buffer
        return buffer


def _dtensor_type() -> Any:
    """``DTensor`` if torch's tensor-parallel package is loaded (else nothing can be one)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


@dataclass
class FileJob:
    """One file of the checkpoint and the function that writes its bytes."""

    name: str
    write: Callable[[Any], None]


def pickle_job(name: str, obj: Any) -> FileJob:
    """A file holding ``torch.save(obj)``."""
    return FileJob(name, lambda handle: torch.save(obj, handle))


def _safetensors_writer(state: dict[str, torch.Tensor]) -> Callable[[Any], None]:
    def write(handle: Any) -> None:
        write_safetensors(handle, state)

    return write


def safetensors_job(name: str, state: dict[str, torch.Tensor]) -> FileJob:
    """A file holding ``state`` as safetensors (tied tensors stored once)."""
    return FileJob(name, _safetensors_writer(state))


def model_jobs(states: list[dict[str, torch.Tensor]], safe: bool) -> list[FileJob]:
    """Files for the model weights: safetensors (tied weights stored once) or pickles."""
    return [
        FileJob(paths.model_file(i, True), _safetensors_writer(state))
        if safe
        else pickle_job(paths.model_file(i, False), state)
        for i, state in enumerate(states)
    ]


@dataclass(frozen=True)
class SaveTarget:
    """Where one checkpoint goes and what it is: fixed before anything is written."""

    final: Path
    rank: int
    num_processes: int
    token: str  # names this save (`hasten.checkpointing.storage.agreement.next_token`)
    #: The save's attributes the manifest records (``step``, ``num_processes``).
    attributes: dict[str, Any] = field(default_factory=dict)
    total_limit: int | None = None
    project_dir: str | None = None

    @property
    def staging(self) -> Path:
        """The hidden folder the files go to before the rename."""
        return paths.staging_path(self.final, self.token)

    @functools.cached_property
    def agreement(self) -> SaveAgreement:
        """How this save's processes agree on who wrote what, where."""
        return SaveAgreement(self.token, self.rank, self.num_processes, self.staging, self.final)


@dataclass(frozen=True)
class LayoutWritten:
    """What a layout's collective write wrote itself, returned from its ``write``.

    ``records``: files already written and synced (this process's DCP shards, and the plan's
    files written meanwhile when ``jobs_written``); ``collected``: ``records`` already holds
    every process's records (gathered by DCP on the main process, in the one folder every
    process writes), so none are exchanged. An engine's save gives ``engine_files`` (written
    through hasten, hashed while written), ``started`` (the plan's files, begun early),
    ``adopting`` (files it wrote by itself, being checksummed), ``later`` (its files to write
    on the writer thread, asynchronously) and ``adopt_unlisted`` (checksum every file no
    process listed).
    """

    records: list[FileRecord] = field(default_factory=list)
    collected: bool = False
    jobs_written: bool = False
    engine_files: EngineFiles | None = None
    adopt_unlisted: bool = False
    started: list[Future[FileRecord]] | None = None
    adopting: list[Future[FileRecord]] = field(default_factory=list)
    later: list[FileJob] = field(default_factory=list)


@dataclass
class SavePlan:
    """What one process writes for one checkpoint: the fixed `SaveTarget`, the files planned,
    and what the layout's write returned (`LayoutWritten`)."""

    target: SaveTarget
    is_writer: bool  # writes the files every process reads (model, optimizer, ...)
    jobs: list[FileJob] = field(default_factory=list)
    #: The names of the files every process reads, when this process writes them.
    shared_names: list[str] = field(default_factory=list)
    #: The communicator the processes agree over (None: one process).
    comm: Communicator | None = None
    #: The user's pre-hooks wrote files into the staging folder: checksum every unlisted one.
    adopt_unlisted: bool = False
    #: Why this process cannot write its part (e.g. its folder cannot be made): it writes
    #: nothing and tells the others in the agreement.
    failure: Exception | None = None
    #: What the layout's collective write returned (set once, by the save transaction).
    written: LayoutWritten = field(default_factory=LayoutWritten)

    @property
    def final(self) -> Path:
        """The checkpoint folder's final name."""
        return self.target.final

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.target.rank

    @property
    def num_processes(self) -> int:
        """How many processes save together."""
        return self.target.num_processes

    @property
    def staging(self) -> Path:
        """The hidden folder the files go to before the rename."""
        return self.target.staging

    @property
    def agreement(self) -> SaveAgreement:
        """How this save's processes agree on who wrote what, where."""
        return self.target.agreement


def _write_job(folder: Path, job: FileJob) -> FileRecord:
    with open(folder / job.name, "wb") as handle:
        writer = ChecksumWriter(EarlyWriteback(handle))
        job.write(writer)
    return writer.record(job.name)


class _FileFailed(Exception):
    """An OSError while writing or syncing one file, with the file's name."""

    def __init__(self, name: str, error: OSError) -> None:
        super().__init__(name)
        self.name = name
        self.error = error


def _write_named(folder: Path, job: FileJob) -> FileRecord:
    try:
        return _write_job(folder, job)
    except OSError as exc:
        raise _FileFailed(job.name, exc) from exc
    except RuntimeError as exc:  # torch's archive writer hides a full disk's errno
        if not out_of_space(folder, exc):
            raise
        raise _FileFailed(job.name, OSError(errno.ENOSPC, str(exc))) from exc


def _sync_named(folder: Path, record: FileRecord) -> None:
    try:
        fsync_path(folder / record.name)
    except OSError as exc:
        raise _FileFailed(record.name, exc) from exc


def _hash_named(folder: Path, name: str) -> FileRecord:
    try:
        return hash_existing(folder, name)
    except OSError as exc:
        raise _FileFailed(name, exc) from exc


def _write_and_sync(folder: Path, job: FileJob) -> FileRecord:
    record = _write_named(folder, job)
    _sync_named(folder, record)
    return record


def _adopt_named(folder: Path, name: str) -> FileRecord:
    record = _hash_named(folder, name)
    _sync_named(folder, record)
    return record


def start_adopting(staging: Path, names: list[str]) -> list[Future[FileRecord]]:
    """Start checksumming and fsyncing ``names``, written by an engine itself, on the I/O threads."""
    pool = io_threads()
    return [pool.submit(_adopt_named, staging, name) for name in names]


def start_jobs(staging: Path, jobs: list[FileJob]) -> list[Future[FileRecord]]:
    """Start writing (and fsyncing) ``jobs`` into ``staging`` on the I/O threads now.

    For a save whose engine works first (DeepSpeed): hasten's small files are written while
    the engine serialises its state; `run_plan` then only waits for them.
    """
    pool = io_threads()
    return [pool.submit(_write_and_sync, staging, job) for job in jobs]


def _engine_records(plan: SavePlan) -> list[FileRecord]:
    """The engine's files written through hasten, once their fsyncs are done."""
    files = plan.written.engine_files
    if files is None:
        return []
    try:
        return files.finish()
    except OSError as exc:
        name = files.failure[0] if files.failure is not None else "an engine file"
        raise _FileFailed(name, exc) from exc


def write_jobs(plan: SavePlan) -> list[FileRecord]:
    """Write and fsync this process's `FileJob` files now (the layout then returns
    ``jobs_written``). A sharded save runs this while DCP writes the shards, on its own thread.
    """
    return _write_all(plan)


def _write_all(plan: SavePlan) -> list[FileRecord]:
    """Write every job's file on a few threads at once, then fsync them all.

    Large writes release the GIL, so two files (the weights and the optimizer state) fill
    page cache on two cores at once; fsyncing after all are written lets the kernel flush the
    first files while the later ones are written, instead of each fsync waiting for a cold start.
    """
    records: list[FileRecord] = []
    try:
        written = plan.written
        if written.started is not None:
            records = [future.result() for future in written.started]
        else:
            pool = io_threads()
            jobs = [*plan.jobs, *written.later]
            records = list(pool.map(functools.partial(_write_named, plan.staging), jobs))
            list(pool.map(functools.partial(_sync_named, plan.staging), records))
        records += _engine_records(plan)
    except _FileFailed as failed:
        exc = failed.error
        if out_of_space(plan.staging, exc):
            raise disk_full_error(plan.final, plan.staging, failed.name) from exc
        message = f"{exc.strerror or exc} while writing {failed.name}"
        raise OSError(
            exc.errno,
            f"{message} of the checkpoint {plan.final}: it was not published and the earlier "
            "checkpoints are untouched. Free some space (or choose another folder) and save "
            "again.",
        ) from exc
    return records


def _adopt_unlisted(
    plan: SavePlan, listed: list[FileRecord]
) -> tuple[list[FileRecord], list[Future[None]]]:
    """Checksum the files an engine wrote by itself (no process listed them); start their fsyncs.

    The fsyncs run while the manifest is written; the folder is published after both.
    """
    pool = io_threads()
    try:
        early = [future.result() for future in plan.written.adopting]
        known = {r.name for r in [*listed, *early]}
        names = [n for n in engine_file_names(plan.staging) if n not in known]
        records = early + list(pool.map(functools.partial(_hash_named, plan.staging), names))
    except _FileFailed as failed:
        raise OSError(
            failed.error.errno,
            f"{failed.error.strerror or failed.error} while checksumming {failed.name} of the "
            f"checkpoint {plan.final}: it was not published and the earlier checkpoints are "
            "untouched.",
        ) from failed.error
    return records, [pool.submit(fsync_path, plan.staging / n) for n in names]


def run_plan(plan: SavePlan, before: Callable[[], LayoutWritten | None] | None = None) -> Path:
    """Run ``before`` (a deferred copy, or an asynchronous layout write whose `LayoutWritten`
    it returns), write this process's files, agree; owners publish.

    Every process joins the agreement even when its own part failed, so the others learn of the
    failure instead of waiting for it; on any failure nothing is published and the staging
    folders are removed.
    """
    try:
        return _run_plan(plan, before)
    except BaseException:
        shutil.rmtree(plan.staging, ignore_errors=True)
        plan.agreement.forget()  # no owner reads this process's records now
        raise
    finally:
        recorder.note(None)


def _run_plan(plan: SavePlan, before: Callable[[], LayoutWritten | None] | None) -> Path:
    failure: Exception | None = None
    records: list[FileRecord] = []
    try:
        if before is not None:
            result = before()
            if result is not None:
                plan.written = result
        if plan.failure is not None:
            raise plan.failure
        written = plan.written
        records = written.records + ([] if written.jobs_written else _write_all(plan))
    except Exception as exc:  # noqa: BLE001 - told to every process, then raised here
        failure = exc
    if plan.written.collected:  # the one shared folder's records are all on the main process
        if failure is not None:
            raise failure
        if plan.rank != 0:
            return plan.final
        return _publish(plan, records, list(range(plan.num_processes)), {})
    agreement = plan.agreement
    if failure is None:
        agreement.share(records)
    recorder.note(f"save_state: wrote its files into {plan.staging}; agreeing with the others")
    shared = set(plan.shared_names)
    own = [r.name for r in records if r.name not in shared]
    folders = agreement.agree(plan.comm, plan.shared_names, own, failure)
    if failure is not None:
        raise failure
    failures = folders.failures()
    if failures is not None:
        raise RuntimeError(
            f"{failures}. The checkpoint was not published; the earlier checkpoints are untouched."
        )
    if folders.owner(plan.rank) != plan.rank:
        return plan.final
    members = folders.members(plan.rank)
    everyone = agreement.records_of(members)
    extra = {} if folders.one_folder else {"processes": folders.processes()}
    return _publish(plan, everyone, members, extra)


def _publish(
    plan: SavePlan, everyone: list[FileRecord], members: list[int], extra: dict[str, Any]
) -> Path:
    """On a folder's owner: list every file in the manifest, rename the folder into place."""
    recorder.note(f"save_state: publishing {plan.final}")
    syncs: list[Future[None]] = []
    if plan.adopt_unlisted or plan.written.adopt_unlisted:
        adopted, syncs = _adopt_unlisted(plan, everyone)
        everyone += adopted
    plan.agreement.remove_claims(members)
    # the subfolders' entries (engine files, async jobs) are made durable once, here
    folders = subdirectories(plan.staging, [r.name for r in everyone])
    syncs += [io_threads().submit(fsync_directory, folder) for folder in folders]
    name = manifest_name(plan.rank)
    attributes = {**plan.target.attributes, "save": plan.target.token, **extra}
    write_manifest(plan.staging, everyone, attributes, name)
    for future in syncs:
        future.result()
    paths.publish(plan.staging, plan.final)
    paths.remove_stale_staging(plan.final)
    target = plan.target
    if target.total_limit is not None and target.project_dir is not None:
        paths.prune_checkpoints(target.project_dir, target.total_limit)
    return plan.final


class Snapshot:
    """State copied to host memory on the writer thread instead of before save_state returns.

    An optimizer's state changes only when it steps, and the training loop runs a forward and
    backward pass before the next step: its copy (two thirds of an AdamW checkpoint) can be
    taken meanwhile. A step pre-hook on each such optimizer holds its next step until the copy
    is done, so the checkpoint is still the state at the moment save_state was called.
    """

    def __init__(self, buffers: HostBuffers) -> None:
        self._buffers = buffers
        self._states: dict[str, Any] = {}
        self._copies: dict[str, Any] = {}
        self._taken = threading.Event()
        self._hooks: list[Any] = []

    def job(self, name: str, state: Any, optimizer: Any) -> FileJob:
        """A file whose object is ``state`` as copied by `take`; holds ``optimizer`` until then."""
        self.defer(name, state, optimizer)
        return FileJob(name, lambda handle: torch.save(self._copies[name], handle))

    def defer(self, name: str, state: Any, optimizer: Any) -> None:
        """Copy ``state`` in `take` (then `copied` gives it); hold ``optimizer`` until then."""
        self._states[name] = state
        register = getattr(optimizer, "register_step_pre_hook", None)
        if register is not None:
            self._hooks.append(register(self._hold))

    def copied(self, name: str) -> Any:
        """The copy `take` made of the state deferred as ``name``."""
        return self._copies[name]

    def _hold(self, *_: Any) -> None:
        self._taken.wait()

    def take(self) -> None:
        """Copy every deferred state (on the writer thread), then let the optimizers step."""
        try:
            self._copies = {name: self._buffers.copy(s) for name, s in self._states.items()}
            self._buffers.finish()
        finally:
            self._states = {}
            self._taken.set()

    def release(self) -> None:
        """Remove the step pre-hooks (from the training thread, once the save is done)."""
        self._taken.set()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class PendingSave:
    """A checkpoint being written on a background thread; `wait` joins it and re-raises."""

    def __init__(
        self,
        plan: SavePlan,
        snapshot: Snapshot | None = None,
        before: Callable[[], LayoutWritten | None] | None = None,
    ) -> None:
        self.plan = plan
        self._snapshot = snapshot
        # what the thread does before writing the plan's files (default: take the snapshot)
        self._before = before or (snapshot.take if snapshot is not None else None)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hasten-async-save", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            run_plan(self.plan, self._before)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread in wait()
            self._error = exc

    def done(self) -> bool:
        """Whether the background write has finished (successfully or not)."""
        return not self._thread.is_alive()

    def wait(self) -> Path:
        """Block until the checkpoint is written (and, on the writer, published)."""
        self._thread.join()
        if self._snapshot is not None:
            self._snapshot.release()
        if self._error is not None:
            raise RuntimeError(
                f"The asynchronous save to {self.plan.final} failed: {self._error}"
            ) from self._error
        return self.plan.final

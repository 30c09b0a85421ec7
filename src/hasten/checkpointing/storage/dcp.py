"""Every torch.distributed.checkpoint (DCP) save and load of hasten: the one module that calls them.

Writes always go through the crash-safe path: staged in a hidden folder, every file hashed while
DCP writes it (`PartedWriter`), listed in a manifest, published by one rename.

- `write_parts` is one DCP save of several part folders inside a staging folder (save_state's
  models and optimizers, `hasten.checkpointing.layouts.dcp_parts`); `read_parts` the matching load,
  verified against the checkpoint's manifest (`PartedReader`).
- `save_folder` / `load_folder` are one DCP checkpoint folder on its own (Accelerate's
  ``save_fsdp_model`` / ``save_fsdp_optimizer``, ``save_sharded_state``): the same writer, with
  the folder's own manifest inside it; a folder with a manifest is verified when loaded, one
  without (another tool wrote it) is read through the restricted readers alone.

Every read refuses what could run code (`hasten.checkpointing.storage.dcp_safe`). No other module
calls DCP's save or load (tests/unit/test_architecture.py checks it). Import this module only
when a DCP checkpoint is saved or loaded (it imports ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata

from hasten.checkpointing.storage.agreement import next_token
from hasten.checkpointing.storage.dcp_safe import SafeFileSystemReader, SafeLoadPlanner
from hasten.checkpointing.storage.dcp_storage import PartedReader, PartedWriter
from hasten.checkpointing.storage.io import UnsafeCheckpointError
from hasten.checkpointing.storage.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    FileRecord,
    read_manifest,
)
from hasten.checkpointing.storage.transaction import save_transaction
from hasten.checkpointing.storage.writer import LayoutWritten, SavePlan, SaveTarget
from hasten.state import PartialState

__all__ = [
    "load_folder",
    "read_parts",
    "save_folder",
    "write_parts",
]


# The part name a lone folder's state dict goes under in `write_parts` / `read_parts`; the
# folder's ``.metadata`` lists the keys without it (a plain DCP checkpoint of the state dict).
_LONE = "folder"


def _distributed() -> bool:
    """Whether DCP coordinates over a process group (several processes in one)."""
    return dist.is_available() and dist.is_initialized() and PartialState().num_processes > 1


def write_parts(
    staging: Path,
    parts: dict[str, dict[str, Any]],
    *,
    folders: dict[str, str] | None = None,
    group: dist.ProcessGroup | None = None,
    also: Callable[[], list[FileRecord]] | None = None,
) -> tuple[list[FileRecord], list[FileRecord]]:
    """Write every part with one DCP save; every process calls it, once the folders exist.

    ``folders`` maps a part to its folder inside ``staging`` ("" for ``staging`` itself; by
    default the part's name). ``group`` is the process group DCP coordinates over (None: the
    default one; a background save passes its own, so its collectives never interleave with
    the training loop's). ``also`` writes this process's other files meanwhile and returns their
    records.

    Returns:
        The records (size, block checksums) of the files this process wrote, and on the main
        process those of every process's files (empty elsewhere).
    """
    writer = PartedWriter(staging, list(parts), also=also, folders=folders)
    try:
        with warnings.catch_warnings():  # DCP warns that one process means no process group
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(parts, storage_writer=writer, process_group=group, no_dist=not _distributed())
    except BaseException as exc:  # DCP's CheckpointException (a BaseException) wraps every rank's
        failures = [f[0] for f in getattr(exc, "failures", {}).values()]
        if not failures or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        first = failures[0]
        if isinstance(first, Exception):
            raise first from exc  # e.g. the OSError of a full disk, on every process
        raise RuntimeError(f"The sharded save failed: {first!r}") from exc
    return _written(writer)


def _written(writer: PartedWriter) -> tuple[list[FileRecord], list[FileRecord]]:
    """What ``writer`` wrote, once DCP has finished (every part and ``.metadata`` on disk)."""
    return list(writer.records), list(writer.all_records)


def read_parts(
    folder: Path,
    state: dict[str, dict[str, Any]],
    manifest: dict[str, Any] | None,
    *,
    folders: dict[str, str] | None = None,
    check: Callable[[Metadata], None] | None = None,
    explain: Callable[[BaseException], BaseException] | None = None,
    process_group: dist.ProcessGroup | None = None,
    no_dist: bool | None = None,
) -> None:
    """Fill ``state`` (``{part: state dict}``) from the part folders of ``folder``, in one DCP load.

    Works on any number of processes; with a manifest every file read is verified first (a
    damaged or unlisted file is refused on every process before any tensor is filled).
    ``check`` sees the merged index before anything is read (and may refuse it: its error is
    raised as is). ``explain`` turns DCP's own failure (a tensor the checkpoint lacks, another
    shape) into the error to raise. ``no_dist`` (default: one process) reads without a
    process group.

    Raises:
        CorruptCheckpointError: a part's file is damaged or its ``.metadata`` is not listed.
        UnsafeCheckpointError: an index or entry holds objects that could run code.
        BaseException: DCP's own failure otherwise, through ``explain`` (as DCP raised it
            without one).
    """
    several = _distributed() if no_dist is None else not no_dist
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if several else (0, 1)
    reader = PartedReader(
        folder, list(state), manifest, rank=rank, world_size=world_size, folders=folders
    )
    try:
        if check is not None:  # every process checks the same index: all refuse together
            check(reader.metadata)
        _load(state, reader, process_group=process_group, no_dist=not several, explain=explain)
    finally:
        reader.close()


def _load(
    state: dict[str, Any],
    reader: SafeFileSystemReader,
    *,
    process_group: dist.ProcessGroup | None,
    no_dist: bool,
    explain: Callable[[BaseException], BaseException] | None = None,
) -> None:
    """The one ``dcp.load`` call: ``reader`` with the restricted planner; a damaged file or an
    unsafe entry is raised as itself, DCP's other failures through ``explain``."""
    try:
        with warnings.catch_warnings():  # DCP warns that one process means no process group
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                state,
                storage_reader=reader,
                planner=SafeLoadPlanner(),
                process_group=process_group,
                no_dist=no_dist,
            )
    except BaseException as exc:  # DCP's CheckpointException wraps every rank's error
        refused = _refusal(exc)
        if refused is not None:
            raise refused from exc
        if explain is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise explain(exc) from exc


def _refusal(exc: BaseException) -> BaseException | None:
    """A damaged file or an unsafe entry among a failed DCP call's errors, raised as itself."""
    failures = [f[0] for f in getattr(exc, "failures", {}).values()] or [exc]
    for failure in failures:
        if isinstance(failure, CorruptCheckpointError):
            return CorruptCheckpointError(str(failure))
        if isinstance(failure, UnsafeCheckpointError):
            return UnsafeCheckpointError(str(failure))
    return None


def _require_every_process(process_group: dist.ProcessGroup | None, num_processes: int) -> None:
    """Refuse a save by a subgroup: a folder's save agrees over every process of the run (who
    writes which file, then the publish), so a subgroup's save would wait on processes that
    never call it."""
    if process_group is None or not _distributed():
        return
    size = dist.get_world_size(process_group)
    if size != num_processes:
        raise ValueError(
            f"A sharded checkpoint is saved by every process of the run together, but "
            f"process_group has {size} of its {num_processes} processes. Call the save on every "
            "process with process_group=None (the default); the tensors' own meshes decide which "
            "process writes which shard."
        )


def save_folder(
    state_dict: dict[str, Any],
    output_dir: str | os.PathLike[str],
    *,
    process_group: dist.ProcessGroup | None = None,
) -> Path:
    """Write ``state_dict`` as one DCP checkpoint folder, crash-safely; every process calls it.

    The files are written into a hidden staging folder beside ``output_dir`` (every process
    its own shards, hashed while written), listed in the folder's manifest, and the folder is
    renamed into place (replacing an older one) once every process has written its part: a
    crash leaves the older folder, or none, never a torn one. Every process needs to see the
    same folder (`FolderNotSharedError` otherwise, before anything is written).

    Returns:
        The published folder.

    Raises:
        ValueError: ``process_group`` leaves out some of the run's processes.
    """
    state = PartialState()
    _require_every_process(process_group, state.num_processes)
    final = Path(output_dir).absolute()
    target = SaveTarget(
        final=final,
        rank=state.process_index,
        num_processes=state.num_processes,
        token=next_token(),
        attributes={"num_processes": state.num_processes},
    )
    plan = SavePlan(target, is_writer=state.is_main_process)
    with save_transaction(plan, one_folder="A sharded checkpoint") as transaction:
        mine, everyone = write_parts(
            plan.staging, {_LONE: state_dict}, folders={_LONE: ""}, group=process_group
        )
        records = everyone if plan.rank == 0 else mine
        plan.written = LayoutWritten(records=records, collected=True)
        transaction.publish()
    return final


def load_folder(
    state_dict: dict[str, Any],
    input_dir: str | os.PathLike[str],
    *,
    process_group: dist.ProcessGroup | None = None,
    no_dist: bool | None = None,
) -> dict[str, Any]:
    """Fill ``state_dict`` from one DCP checkpoint folder (`save_folder`'s, or any DCP folder).

    A folder with a manifest is verified against it while read; one without is read through
    the restricted readers alone. ``no_dist`` (default: one process) reads it without a
    process group.

    Raises:
        CorruptCheckpointError: a file is missing, unlisted or damaged (with a manifest).
        UnsafeCheckpointError: the index or an entry holds objects that could run code.
    """
    folder = Path(input_dir)
    alone = not _distributed() if no_dist is None else no_dist
    if not (folder / MANIFEST_NAME).is_file():  # written by another tool: restricted reads
        reader = SafeFileSystemReader(folder)
        reader.read_metadata()  # here, so a refusal is raised as itself
        _load(state_dict, reader, process_group=process_group, no_dist=alone)
        return state_dict
    read_parts(
        folder,
        {_LONE: state_dict},
        read_manifest(folder),
        folders={_LONE: ""},
        process_group=process_group,
        no_dist=alone,
    )
    return state_dict

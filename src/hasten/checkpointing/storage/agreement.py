"""Which processes share a checkpoint folder, and what each one wrote, agreed over the process group.

hasten never assumes that every process sees the same folder: nodes may share no storage, and a
Ray Train worker often saves into a temporary folder of its own. A save therefore goes:

1. Every process makes the staging folder of its own target (`hasten.checkpointing.storage.paths.
   staging_path`, whose name is unique to this save, so nothing a crashed save left can mix in)
   and leaves a claim in it, ``.hasten_rank_<rank>`` (`SaveAgreement.claim`); one barrier, and
   every claim is in place.
2. It writes its files there; the main process (each machine's with ``save_on_each_node``) also
   writes the files every process reads.
3. It leaves the records of what it wrote (sizes, block checksums) in the process group's store
   and joins one exchange, `SaveAgreement.agree`: every process sends a few facts (its host, its
   target, the claims it sees in its staging folder, the names it wrote, or its error). From
   these every process reaches the same `Folders`: which processes share each folder (its
   owner is the lowest rank in it) and whether any process failed.
4. Each folder's owner reads its members' records from the store, writes the folder's manifest
   and renames the folder into place.

Nothing polls files, and the exchange is a collective: a process that died makes the others
fail within seconds, with the hang recorder's report of what each was doing, instead of a wait.
Sharded (DCP) and engine checkpoints need one folder every process writes; `require_one_folder`
refuses other set-ups before anything is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import uuid
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hasten.checkpointing.storage.manifest import FileRecord
from hasten.ops.comm import Communicator, current_comm, group_comm
from hasten.state import PartialState
from hasten.state._shared import register_reset_hook
from hasten.state.recorder import CollectiveTimeoutError, default_store

__all__ = [
    "CLAIM_PREFIX",
    "FolderNotSharedError",
    "Folders",
    "Report",
    "SaveAgreement",
    "agree_on_outcome",
    "background_comm",
    "background_group",
    "missing_files",
    "next_token",
    "require_one_folder",
]

CLAIM_PREFIX = ".hasten_rank_"
# Created exclusively by the first process that writes the shared files into a folder: with
# save_on_each_node, two machines that do share a folder must not both write them.
_SHARED_LOCK = ".hasten_shared_files"
_SESSION_KEY = "hasten/checkpoint/session"
_RECORDS_KEY = "hasten/checkpoint/{token}/{rank}"


class FolderNotSharedError(RuntimeError):
    """A checkpoint that needs one folder every process writes was given folders they do not share."""


# The session id of this process group's saves and how many saves it has begun: every process
# counts the same saves, so (session, count) names a save identically everywhere. "shared": the
# parent folders (this process's path) that an earlier save of the group found shared by every
# process, with that save's count, so the next save there needs no barrier and exchange.
_saves: dict[str, Any] = {"group": None, "session": "", "count": 0, "shared": {}}


def _forget_saves() -> None:
    _saves.update(group=None, session="", count=0, shared={})


register_reset_hook(_forget_saves)


def _world() -> Any:
    """The default process group when several processes share it, else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.group.WORLD


def _session(world: Any) -> str:
    """One id per process group, the same on every process: the first process to ask sets it."""
    mine = uuid.uuid4().hex[:8]
    store = default_store()
    if store is not None:
        return bytes(store.compare_set(_SESSION_KEY, "", mine)).decode()
    shared = [mine]
    current_comm().broadcast_object_list(shared, 0, "save_state")
    return str(shared[0])


def next_token() -> str:
    """This save's name, the same on every process (every process must call it once per save).

    The first save of a process group fixes a session id through the group's store; each save
    adds its count, so a folder left by a crashed save, or by an earlier run, never matches.
    """
    world = _world()
    group = _saves["group"]
    if group is None or group() is not world:
        _saves["session"] = uuid.uuid4().hex[:8] if world is None else _session(world)
        _saves["group"] = weakref.ref(world) if world is not None else (lambda: None)
        _saves["count"] = 0
        _saves["shared"] = {}
    _saves["count"] += 1
    return f"{_saves['session']}{_saves['count']}"


@dataclass(frozen=True)
class Report:
    """What one process tells the others after writing its part of a save."""

    rank: int
    host: str
    folder: str  # the final folder it was given (absolute)
    owner: int  # the lowest rank whose claim is in its staging folder
    claims: int  # how many claims it sees there
    shared: tuple[str, ...]  # files every process reads, which it wrote there
    own: tuple[str, ...]  # its own files (RNG states, accumulated gradients)
    error: str | None = None

    def where(self) -> str:
        """``process 1 on host-b into /data/ckpt``."""
        return f"process {self.rank} on {self.host} into {self.folder}"


@dataclass(frozen=True)
class Folders:
    """The agreed answer of one exchange: every process's `Report`, in rank order."""

    reports: tuple[Report, ...]

    def owner(self, rank: int) -> int:
        """The lowest rank sharing ``rank``'s folder.

        A claim seen late (a cache of a network file system) only splits a chain, which is
        followed to its end, so every process computes the same owner.
        """
        owner = self.reports[rank].owner
        while self.reports[owner].owner != owner:
            owner = self.reports[owner].owner
        return owner

    def members(self, owner: int) -> list[int]:
        """The ranks whose folder ``owner`` publishes."""
        return [r.rank for r in self.reports if self.owner(r.rank) == owner]

    @property
    def one_folder(self) -> bool:
        """Whether every process wrote into the same folder."""
        return all(self.owner(r.rank) == 0 for r in self.reports)

    def failures(self) -> str | None:
        """What went wrong on every process that failed, or None."""
        failed = [
            f"Process {r.rank} could not write its part of {r.folder} (on {r.host}): {r.error}"
            for r in self.reports
            if r.error
        ]
        return "; ".join(failed) if failed else None

    def processes(self) -> list[dict[str, Any]]:
        """Where each process wrote which files, for the manifests of folders not shared by all."""
        return [
            {
                "rank": r.rank,
                "host": r.host,
                "folder": r.folder,
                "shared": list(r.shared),
                "own": list(r.own),
            }
            for r in self.reports
        ]


def _claims(staging: Path) -> list[int]:
    ranks = []
    for name in os.listdir(staging):
        if name.startswith(CLAIM_PREFIX) and name[len(CLAIM_PREFIX) :].isdigit():
            ranks.append(int(name[len(CLAIM_PREFIX) :]))
    return ranks


class SaveAgreement:
    """One save's agreement among the processes (see the module docstring)."""

    def __init__(
        self, token: str, rank: int, num_processes: int, staging: Path, final: Path
    ) -> None:
        self.token = token
        self.rank = rank
        self.num_processes = num_processes
        self.staging = staging
        self.final = final
        self._records: list[FileRecord] = []
        self._shared_key = False

    def claim(self) -> None:
        """Make this save's staging folder (and its parents) and leave this process's claim."""
        self.staging.mkdir(parents=True, exist_ok=True)
        (self.staging / f"{CLAIM_PREFIX}{self.rank}").touch()

    def take_shared_files(self) -> bool:
        """Whether this process writes the shared files into its folder (no other writer did).

        Only one of several writers sharing a folder gets it (``save_on_each_node`` on
        machines that share storage); the others write only their own files.
        """
        try:
            os.close(os.open(self.staging / _SHARED_LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def share(self, records: list[FileRecord]) -> None:
        """Leave this process's records where its folder's owner reads them."""
        self._records = list(records)
        store = default_store() if self.num_processes > 1 else None
        if store is not None:
            payload = json.dumps([r.to_json() for r in records])
            store.set(_RECORDS_KEY.format(token=self.token, rank=self.rank), payload)
            self._shared_key = True

    def agree(
        self,
        comm: Communicator | None,
        shared: list[str],
        own: list[str],
        error: BaseException | None,
    ) -> Folders:
        """Exchange this process's `Report` with every other process (a collective)."""
        claims = _claims(self.staging) if self.staging.is_dir() else [self.rank]
        mine = Report(
            rank=self.rank,
            host=socket.gethostname(),
            folder=str(self.final),
            owner=min([*claims, self.rank]),
            claims=len(set(claims) | {self.rank}),
            shared=tuple(shared),
            own=tuple(own),
            error=None if error is None else _describe(error),
        )
        if comm is None or self.num_processes == 1:
            return Folders((mine,))
        reports = comm.all_gather_object(mine, "save_state (agreeing on what was written)")
        return Folders(tuple(reports))

    def records_of(self, ranks: list[int]) -> list[FileRecord]:
        """The records the processes ``ranks`` left (this process's own without the store).

        Only a folder's owner reads them, once, after the exchange: it then drops them.
        """
        found = list(self._records) if self.rank in ranks else []
        others = [r for r in ranks if r != self.rank]
        if others:
            store = default_store()
            keys = [_RECORDS_KEY.format(token=self.token, rank=r) for r in others]
            for payload in store.multi_get(keys):
                found += [FileRecord.from_json(f) for f in json.loads(bytes(payload))]
            for key in keys:
                store.delete_key(key)
        if self.rank in ranks:
            self.forget()
        return found

    def remove_claims(self, ranks: list[int]) -> None:
        """Remove the claims (and the shared-files lock) before the manifest is written."""
        for rank in ranks:
            (self.staging / f"{CLAIM_PREFIX}{rank}").unlink(missing_ok=True)
        (self.staging / _SHARED_LOCK).unlink(missing_ok=True)

    def forget(self) -> None:
        """Drop this process's records from the store (no owner will read them)."""
        if self._shared_key:
            store = default_store()
            with contextlib.suppress(Exception):  # the store's host may be gone at the end
                store.delete_key(_RECORDS_KEY.format(token=self.token, rank=self.rank))
            self._shared_key = False


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if not isinstance(error, OSError) else str(error)


def require_one_folder(
    agreement: SaveAgreement, what: str, error: BaseException | None = None
) -> None:
    """Refuse, on every process, a save whose processes do not all write into one folder.

    Cheap: each process left its claim (`SaveAgreement.claim`); after a barrier each counts the
    claims it sees, and one exchange tells everyone whether every process saw every claim.
    Nothing has been written yet; the staging folders are removed. ``error``: this process
    could not make its folder (told to the others, then raised).

    Raises:
        FolderNotSharedError: some process does not see the folder the others write.
        RuntimeError: another process could not make its folder.
    """
    state = PartialState()
    if state.num_processes == 1:
        if error is not None:
            raise error
        return
    if _checked_before(agreement, error):
        return
    state.wait_for_everyone()  # every claim is in place
    folders = agreement.agree(current_comm(), [], [], error)
    failures = folders.failures()
    if error is not None:
        raise error
    if failures is not None:
        shutil.rmtree(agreement.staging, ignore_errors=True)
        raise RuntimeError(f"{failures}. Nothing was written.")
    if folders.one_folder and all(r.claims == state.num_processes for r in folders.reports):
        _saves["shared"][str(agreement.final.parent)] = _saves["count"]
        return
    shutil.rmtree(agreement.staging, ignore_errors=True)
    groups: dict[int, list[Report]] = {}
    for report in folders.reports:
        groups.setdefault(folders.owner(report.rank), []).append(report)
    described = "; ".join(
        f"processes {', '.join(str(r.rank) for r in group)} ({group[0].host}: {group[0].folder})"
        for group in groups.values()
    )
    raise FolderNotSharedError(
        f"{what} needs one folder that every process writes, but the processes save into "
        f"{len(groups)} different folders: {described}. Nothing was written. Save into a folder "
        "on storage every machine mounts (NFS, a cluster file system) under the same path, or "
        "save full (gathered) state dicts instead, which need no shared folder: FSDP's "
        "state_dict_type='FULL_STATE_DICT'."
    )


def _checked_before(agreement: SaveAgreement, error: BaseException | None) -> bool:
    """Whether an earlier save of this group found every process's parent folder shared by all,
    and every process now saves under the same name there: one small reduction (a collective)
    instead of a barrier and an exchange, so repeated sharded saves pay the check once.

    Each process names the save that checked its parent (0: none); the answer is yes only when
    every process names the same one, so parents checked by different saves never pass.
    """
    checked = int(_saves["shared"].get(str(agreement.final.parent), 0))
    name = zlib.crc32(agreement.final.name.encode())
    comm = current_comm()
    facts = torch.tensor(
        [checked, -checked, name, -name, int(error is not None)],
        dtype=torch.int64,
        device=comm.device,
    )
    comm.all_reduce(facts, "max", "save_state (is the folder known to be shared?)", facts)
    latest, negated_earliest, top_name, negated_low_name, failed = facts.tolist()
    return (
        failed == 0 and latest > 0 and latest == -negated_earliest and top_name == -negated_low_name
    )


def missing_files(folder: Path, manifest: dict[str, Any], rank: int) -> str | None:
    """Which files process ``rank`` needs from a checkpoint whose processes did not share one
    folder, but ``folder`` lacks, and where each was written; None when nothing is missing."""
    processes = manifest.get("processes")
    if not processes:
        return None
    present = set(manifest["files"])
    written: dict[str, list[dict[str, Any]]] = {}
    needed: list[str] = []
    for entry in processes:
        for name in entry["shared"]:
            written.setdefault(name, []).append(entry)
            if name not in needed:
                needed.append(name)
        for name in entry["own"]:
            written.setdefault(name, []).append(entry)
            if entry["rank"] == rank:
                needed.append(name)
    missing = [name for name in needed if name not in present]
    if not missing:
        return None
    where = "; ".join(
        f"{name} (written by "
        + " and ".join(
            f"process {e['rank']} on {e['host']} into {e['folder']}" for e in written[name]
        )
        + ")"
        for name in missing
    )
    return (
        f"Process {rank} cannot load {folder}: the processes that saved it did not share one "
        f"folder, and this folder lacks {len(missing)} file(s) this process needs: {where}. "
        "Copy those files into this folder (merging the folders is safe: each folder's "
        "manifest keeps its own name), or save into a folder every process sees, or with "
        "ProjectConfiguration(save_on_each_node=True) when each machine's processes share one."
    )


def agree_on_outcome(
    error: BaseException | None,
    outcome: str = "The checkpoint was not published",
) -> None:
    """Wait for every process; if another one failed (to save, to verify), raise here too.

    The exchange doubles as the barrier after publishing, so a failure on one process never
    leaves the others blocked in a later collective. A hang report names it after ``outcome``'s
    operation (save_state or load_state).
    """
    state = PartialState()
    if state.num_processes == 1 or isinstance(error, CollectiveTimeoutError):
        return  # (a collective that lost a peer fails on every process that is left)
    comm = current_comm()
    op = "load_state" if "loaded" in outcome else "save_state"
    # one small reduction when every process succeeded (the usual case); names only on failure
    failed = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=comm.device)
    comm.all_reduce(failed, "max", f"{op} (agreeing on the outcome)", failed)
    if int(failed.item()) == 0:
        return
    mine = [f"process {state.process_index}: {error}"] if error is not None else []
    reported = comm.all_gather_object(mine, f"{op} (telling what failed)")
    failures = [f for found in reported for f in found if f not in mine]
    if failures and error is None:
        raise RuntimeError(f"{outcome}: " + "; ".join(failures))


def background_group(holder: Any) -> Any:
    """The gloo group a background save coordinates over, made once per ``holder``.

    Every process calls it together (making a group is collective); None without a group.
    """
    import torch.distributed as dist

    if _world() is None:
        return None
    if getattr(holder, "group", None) is None:
        holder.group = dist.new_group(backend="gloo")
    return holder.group


def background_comm(holder: Any) -> Communicator | None:
    """A communicator over `background_group`, for a background save's exchange."""
    group = background_group(holder)
    return None if group is None else group_comm(group)

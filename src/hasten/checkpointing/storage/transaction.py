"""The one save transaction every checkpoint save runs: claim, check, write, publish, agree.

`save_transaction` is the sequence every save follows, written once: claim this process's
staging folder, check that every process writes one folder (when the layout needs it) or
settle who writes the shared files, let the body plan and write, then publish through
`SaveTransaction.publish` (agreement, rename, agreement) or hand the publish to a writer thread
(`SaveTransaction.publish_later`). A failure the body raises (every process's DCP write fails
together) removes the staging folder and is agreed by every process before it is raised, so
nothing is published and no process waits for another. Used by `save_state`
(`hasten.checkpointing.state`) and by a DCP folder of its own (`dcp.save_folder`).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hasten.checkpointing.storage.agreement import agree_on_outcome, require_one_folder
from hasten.checkpointing.storage.writer import (
    LayoutWritten,
    PendingSave,
    SavePlan,
    Snapshot,
    run_plan,
)
from hasten.ops.comm import Communicator, current_comm
from hasten.state import PartialState, recorder

__all__ = ["SaveTransaction", "save_transaction"]


class SaveTransaction:
    """One save in progress (see the module): its plan, and the publish, run once."""

    def __init__(self, plan: SavePlan) -> None:
        self.plan = plan
        self.settled = False

    def publish(self) -> Path:
        """Write this process's files, agree on what every process wrote, publish, agree again.

        Every process calls it; a failure anywhere is raised on every process.
        """
        self.settled = True
        self.plan.comm = current_comm()
        try:
            final = run_plan(self.plan)
        except Exception as exc:  # noqa: BLE001 - every process learns the outcome, then raises
            agree_on_outcome(exc)
            raise
        agree_on_outcome(None)  # published before any process goes on
        return final

    def publish_later(
        self,
        comm: Communicator | None,
        snapshot: Snapshot | None,
        before: Callable[[], LayoutWritten] | None,
    ) -> PendingSave:
        """Write and publish on a writer thread, agreeing over ``comm`` (a group of its own);
        `hasten.checkpointing.state.finish_async_save` joins it and agrees on the outcome."""
        self.settled = True
        self.plan.comm = comm
        return PendingSave(self.plan, snapshot, before=before)


def _claim(plan: SavePlan, one_folder: str | None, save_on_each_node: bool) -> None:
    """Make and claim this process's staging folder; check or settle who writes where.

    A layout that needs one folder (``one_folder`` names it in the refusal) is refused on every
    process before anything is written when the processes do not share it, and then only the
    main process writes the shared files. Otherwise a barrier puts every claim in place, and
    with ``save_on_each_node`` of several machines' writers sharing a folder only the first
    writes them. A folder that cannot be made is kept as the plan's failure, which the
    agreement tells every process.
    """
    state = PartialState()
    recorder.note(f"save_state: making {plan.staging}")
    try:
        plan.agreement.claim()
    except OSError as exc:
        hint = ""
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            hint = (
                f" {plan.final.parent} cannot be written by this process (read-only or not "
                "permitted): save to a writable folder (the output_dir argument, or "
                "ProjectConfiguration(project_dir=...)), or make it writable."
            )
        plan.failure = OSError(exc.errno, f"Cannot make the checkpoint folder: {exc}.{hint}")
    if one_folder is not None:
        try:
            require_one_folder(plan.agreement, one_folder, plan.failure)
        finally:
            recorder.note(None)
        plan.is_writer = state.is_main_process
        return
    state.wait_for_everyone()  # every claim is in place before any process looks for one
    if plan.failure is None and plan.is_writer and save_on_each_node:
        plan.is_writer = state.num_processes == 1 or plan.agreement.take_shared_files()


@contextmanager
def save_transaction(
    plan: SavePlan, *, one_folder: str | None, save_on_each_node: bool = False
) -> Iterator[SaveTransaction]:
    """Claim ``plan``'s staging folder, run the body, and clean up and agree if it fails.

    The body plans and writes, then calls `SaveTransaction.publish` or
    `SaveTransaction.publish_later` once. An exception raised before that (a DCP write that
    failed on every process) removes the staging folder and is agreed by every process, then
    raised.

    Raises:
        FolderNotSharedError: ``one_folder`` and the processes do not share the folder.
        RuntimeError: the body returned without publishing (a bug in the caller).
    """
    _claim(plan, one_folder, save_on_each_node)
    transaction = SaveTransaction(plan)
    try:
        yield transaction
    except Exception as exc:
        if not transaction.settled:  # nothing is published; every process raises
            shutil.rmtree(plan.staging, ignore_errors=True)
            agree_on_outcome(exc)
        raise
    if not transaction.settled:
        shutil.rmtree(plan.staging, ignore_errors=True)
        raise RuntimeError(
            f"The save of {plan.final} ended without publishing: call publish() or "
            "publish_later() inside save_transaction."
        )

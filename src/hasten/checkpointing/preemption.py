"""Preemption: on SIGTERM or SIGUSR1, finish the step, checkpoint on every process, exit 75.

Clusters announce the end of a job with a signal (SLURM sends SIGUSR1 or SIGTERM before its
time limit, Kubernetes SIGTERM). The handler only sets a flag. Between two batches of a
prepared data loader (the step that used the previous batch is complete, scheduler and
zero_grad included) the processes combine their flags; when any is set, every process saves
the full state with automatic naming and the job exits with `PREEMPTED_EXIT_CODE`, so
``hasten launch --max_restarts N`` restarts it and ``load_state()`` continues from there.

Agreeing costs no blocking collective: each boundary waits for the all-reduce issued at the
previous boundary (long finished, it ran during the step) and issues the next one, so all
processes act at the same boundary, one step after the signal. One process needs no collective.
Loaders whose processes may see different batch counts (``even_batches=False``) skip the check.

It is on when the Accelerator uses ``ProjectConfiguration(automatic_checkpoint_naming=True)``
with a ``project_dir`` (the configuration that makes ``load_state()`` resume on restart), and
only in the main thread of the process; `end_training` turns it off again.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from hasten.data_loader.base import ResumableDataLoader
from hasten.logging import get_logger
from hasten.state import PartialState
from hasten.state._shared import register_reset_hook

__all__ = ["PREEMPTED_EXIT_CODE", "PREEMPTION_SIGNALS", "PreemptionWatcher", "active_watcher"]

# EX_TEMPFAIL from sysexits.h: "try again later", which is what a preempted job should do.
PREEMPTED_EXIT_CODE = 75
PREEMPTION_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)

logger = get_logger(__name__)

# One training loop per process: installing a watcher retires the previous one.
_active: list[PreemptionWatcher] = []


def active_watcher() -> PreemptionWatcher | None:
    """The installed watcher, if any."""
    return _active[0] if _active else None


def _retire_active() -> None:
    if _active:
        _active[0].uninstall()


register_reset_hook(_retire_active)  # a fresh state (tests, new launch) starts unwatched


class PreemptionWatcher:
    """Turn a preemption signal into a checkpoint on every process at the same batch boundary.

    Args:
        save: saves the state on every process (called on all of them together); returns the
            folder it wrote.
        signals: the signals that mean "preempted".
    """

    def __init__(
        self,
        save: Callable[[], str],
        signals: tuple[signal.Signals, ...] = PREEMPTION_SIGNALS,
    ) -> None:
        self.save = save
        self.signals = signals
        self.requested = False
        self._previous: dict[signal.Signals, Any] = {}
        self._pending: Any = None  # the all-reduce issued at the previous boundary
        self._flag = torch.zeros(1, dtype=torch.int32)  # host memory: reading it never syncs
        self._group: Any = None
        self._installed = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def install(self) -> bool:
        """Install the signal handlers and the boundary check; False outside the main thread."""
        if self._installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        _retire_active()
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        multi = PartialState().num_processes > 1 and torch.distributed.is_initialized()
        if multi and torch.distributed.get_backend() != "gloo":
            # The flag travels on a CPU group: reading a GPU result would sync every step.
            # Creating a group is collective; every process builds its Accelerator together.
            self._group = torch.distributed.new_group(backend="gloo")
        ResumableDataLoader.batch_boundary_hook = self._agree if multi else self._check
        _active[:] = [self]
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Put the previous signal handlers back and stop checking at batch boundaries."""
        if not self._installed:
            return
        if threading.current_thread() is threading.main_thread():  # (gc may run us elsewhere)
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()
        if ResumableDataLoader.batch_boundary_hook in (self._agree, self._check):
            ResumableDataLoader.batch_boundary_hook = None
        self._drain()
        if _active and _active[0] is self:
            _active.clear()
        self._installed = False

    def _check(self) -> None:
        """One process: act on the flag directly."""
        if self.requested:
            self._checkpoint_and_exit()

    def _agree(self) -> None:
        """Several processes: read the previous boundary's all-reduce, issue this boundary's."""
        agreed = False
        flag = self._flag
        if self._pending is not None:
            self._pending.wait()
            agreed = bool(flag[0])
        flag[0] = 1 if self.requested else 0
        self._pending = torch.distributed.all_reduce(
            flag, op=torch.distributed.ReduceOp.MAX, group=self._group, async_op=True
        )
        if agreed:
            self._drain()
            self._checkpoint_and_exit()

    def _drain(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    def _checkpoint_and_exit(self) -> None:
        folder = self.save()
        logger.warning(
            f"Preempted: saved the training state to {folder}; exiting with code "
            f"{PREEMPTED_EXIT_CODE} so that the launcher restarts the job."
        )
        self.uninstall()
        raise SystemExit(PREEMPTED_EXIT_CODE)

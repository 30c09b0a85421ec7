"""A preemption signal that nothing will save: say so in the log, then end as the signal would.

Preemption checkpoints need ``ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)``
(`hasten.checkpointing.preemption`). Without them a SIGTERM or SIGUSR1 ends the process with no
checkpoint, and a preempted job looks, in its log, like one that simply stopped. This notice
makes the loss visible: it logs a warning naming the settings that would have saved, then puts
the default handling back and sends the signal again, so the process ends exactly as it would
have without hasten. It takes only signals left at their default; a handler of the user's own is
never replaced. Kept apart from `hasten.checkpointing` so that a plain run does not load it.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from hasten.logging import get_logger
from hasten.state._shared import register_reset_hook

__all__ = ["UNSAVED_SIGNALS", "UnsavedSignalNotice"]

# The signals hasten's preemption checkpoints answer (checkpointing.preemption.PREEMPTION_SIGNALS).
UNSAVED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)

logger = get_logger(__name__)

# The notices listening now: a fresh state (tests, a new launch) gives their signals back.
_listening: list[UnsavedSignalNotice] = []


def _retire_all() -> None:
    for notice in list(_listening):
        notice.uninstall()


register_reset_hook(_retire_all)


class UnsavedSignalNotice:
    """Warn that a preemption signal arrived with no checkpoint configured, then end the process."""

    def __init__(self, signals: tuple[signal.Signals, ...] = UNSAVED_SIGNALS) -> None:
        self.signals = signals
        self._taken: list[signal.Signals] = []

    def install(self) -> bool:
        """Listen on the signals still at their default; False outside the main thread or if none is."""
        if self._taken:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in self.signals:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, self._on_signal)
                self._taken.append(sig)
        if self._taken:
            _listening.append(self)
        return bool(self._taken)

    def uninstall(self) -> None:
        """Give the signals back their default handling (only those this notice took)."""
        if threading.current_thread() is not threading.main_thread():
            return  # (a finalizer may run elsewhere; signal.signal works only in the main thread)
        for sig in self._taken:
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, signal.SIG_DFL)
        self._taken.clear()
        if self in _listening:
            _listening.remove(self)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        logger.warning(
            f"Received {name}, a preemption signal, but no checkpoint will be saved: preemption "
            "checkpoints need Accelerator(project_config=ProjectConfiguration(project_dir=..., "
            "automatic_checkpoint_naming=True)). Ending the process as the signal asks; the "
            "training since the last save_state() is lost.",
            main_process_only=False,
        )
        self.uninstall()
        os.kill(os.getpid(), signum)

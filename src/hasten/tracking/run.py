"""`RunTracker`: the shared shape of trackers whose library hands back one run object.

W&B, Trackio and SwanLab all take a project name plus init keyword arguments, create a run in
``start()``, and expose that run as ``tracker``; only what they call differs.
"""

from __future__ import annotations

from typing import Any

from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner

__all__ = ["RunTracker"]


class RunTracker(GeneralTracker):
    """A tracker whose ``start()`` stores its library's run object in ``self.run``.

    Args:
        run_name: the project (or run) name passed to the library.
        **kwargs: passed to the library's ``init``.
    """

    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None
        self._skips = SkipWarner(self.name)

    @property
    def tracker(self) -> Any:
        """The library's run object (None before ``start()``)."""
        return self.run

    def finish(self) -> None:
        """Finish the run (for W&B offline mode this closes the local run folder)."""
        if self.run is not None:
            self.run.finish()

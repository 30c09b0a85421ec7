"""`GeneralTracker`: the interface every experiment tracker implements (built-in or custom).

A tracker is created with the project name (and the logging directory when it declares
``requires_logging_directory``), started once by `TrackerManager.init`, then receives
`store_init_configuration`, `log` and `finish` calls. Its library is imported in `start`, so
building one costs nothing and processes that never start it never import the library.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from hasten.state import PartialState

__all__ = ["AbsentTracker", "GeneralTracker", "on_main_process"]

_T = TypeVar("_T")


def on_main_process(function: Callable[..., _T]) -> Callable[..., _T | None]:
    """Decorate a tracker method so it runs only on the main process when the tracker's
    ``main_process_only`` is true (elsewhere it returns None); for custom trackers used directly.

    The process is looked up when the method is called, not when the class is defined, so the
    process group can still be configured after the tracker is built.
    """

    @functools.wraps(function)
    def run_if_main(self: Any, *args: Any, **kwargs: Any) -> _T | None:
        if getattr(self, "main_process_only", False) and not PartialState().is_main_process:
            return None
        return function(self, *args, **kwargs)

    return run_if_main


class GeneralTracker:
    """Base class of all trackers; subclass it to log somewhere hasten does not know about.

    A subclass sets the class attributes ``name`` (used in ``log_with`` and `get_tracker`) and
    ``requires_logging_directory``, defines a ``tracker`` property returning the library object
    (e.g. the W&B run), and overrides the methods below that its backend supports.
    ``main_process_only = False`` makes it run on every process instead of the main one only.
    """

    name: ClassVar[str]
    requires_logging_directory: ClassVar[bool]
    main_process_only: ClassVar[bool] = True

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [
            attr
            for attr in ("name", "requires_logging_directory", "tracker")
            if not hasattr(type(self), attr)
        ]
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} does not define {', '.join(missing)}. A GeneralTracker "
                "subclass needs class attributes `name` and `requires_logging_directory` and a "
                "`tracker` property; add them to the class body."
            )

    def start(self) -> None:
        """Open the run (import the library, create files); called once by init_trackers."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record ``values`` as the run's hyperparameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (metric name -> value) at ``step``."""

    def finish(self) -> None:
        """Close the run and release files; called by end_training."""


class AbsentTracker(GeneralTracker):
    """What `get_tracker` returns on a process where the tracker does not run: every call is a no-op.

    Lets ``accelerator.get_tracker("wandb", unwrap=True).log_artifact(...)`` run unguarded on
    every process while only the main process really logs.
    """

    name = "absent"
    requires_logging_directory = False

    def __init__(self, name: str = "absent") -> None:
        super().__init__(_blank=True)
        self.requested_name = name

    @property
    def tracker(self) -> AbsentTracker:
        """The tracker itself, so unwrapping keeps the no-op behaviour."""
        return self

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def _nothing(*args: Any, **kwargs: Any) -> None:
            return None

        return _nothing

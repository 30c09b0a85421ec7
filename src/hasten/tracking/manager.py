"""`TrackerManager`: the trackers of one Accelerator, behind init_trackers/get_tracker/log/end_training.

The Accelerator builds one with its ``log_with``, ``logging_dir`` and whether this process is
the main one. Trackers with ``main_process_only`` (all built-in ones) are only created on the
main process, so other processes never import a tracking library nor touch a file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from hasten.tracking.base import AbsentTracker, GeneralTracker
from hasten.tracking.registry import LogWith, filter_trackers, tracker_class

__all__ = ["TrackerManager"]


class TrackerManager:
    """Create, feed and close the trackers chosen by ``log_with`` (see `filter_trackers`).

    Args:
        log_with: tracker names, ``"all"``, `GeneralTracker` instances, a list of those, or None.
        logging_dir: folder for trackers that write files (TensorBoard, the built-in "jsonl").
        is_main_process: whether this process runs main-process-only trackers.
    """

    def __init__(
        self,
        log_with: LogWith,
        logging_dir: str | os.PathLike[str] | None = None,
        is_main_process: bool = True,
    ) -> None:
        self.log_with: list[str | GeneralTracker] = filter_trackers(log_with, logging_dir)
        self.logging_dir = logging_dir
        self.is_main_process = is_main_process
        self.trackers: list[GeneralTracker] = []
        self._project_name: str | None = None
        self._open = False

    @property
    def initialized(self) -> bool:
        """Whether `init` ran (and `finish` has not closed the trackers since)."""
        return self._open

    def _runs_here(self, tracker: type[GeneralTracker] | GeneralTracker) -> bool:
        return self.is_main_process or not getattr(tracker, "main_process_only", True)

    def _build(
        self, name: str, project_name: str, kwargs: Mapping[str, Any]
    ) -> GeneralTracker | None:
        cls = tracker_class(name)
        if not self._runs_here(cls):
            return None
        # Every tracker takes (project_name, [logging_dir,] **kwargs); the base class does not.
        factory: Callable[..., GeneralTracker] = cls
        if cls.requires_logging_directory:
            return factory(project_name, self.logging_dir, **kwargs)
        return factory(project_name, **kwargs)

    def init(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Create and start every tracker for ``project_name`` and store ``config`` in each.

        ``init_kwargs`` maps a tracker name to the keyword arguments of its constructor, e.g.
        ``{"wandb": {"mode": "offline"}}``.
        """
        if self.initialized:
            raise RuntimeError(
                f"init_trackers({project_name!r}) called while the trackers of "
                f"{self._project_name!r} are open; call end_training() before starting new ones."
            )
        named = [e for e in self.log_with if not isinstance(e, GeneralTracker)]
        # trackers given as objects already have their run name: then the project may be None
        if named and (not isinstance(project_name, str) or not project_name):
            raise ValueError(
                f"init_trackers needs a non-empty project name string, got {project_name!r}: "
                f"the trackers {named} are created with it."
            )
        if init_kwargs is not None and not isinstance(init_kwargs, Mapping):
            raise TypeError(
                "init_kwargs must map tracker names to keyword dicts, e.g. "
                f"{{'wandb': {{'mode': 'offline'}}}}; got {type(init_kwargs).__name__}."
            )
        kwargs = init_kwargs or {}
        trackers: list[GeneralTracker] = []
        for entry in self.log_with:
            if isinstance(entry, GeneralTracker):
                if self._runs_here(entry):
                    trackers.append(entry)
                continue
            built = self._build(entry, project_name, kwargs.get(entry, {}))
            if built is not None:
                trackers.append(built)
        for tracker in trackers:
            tracker.start()
        if config is not None:
            for tracker in trackers:
                tracker.store_init_configuration(config)
        self.trackers = trackers
        self._project_name = project_name
        self._open = True

    def get(self, name: str, unwrap: bool = False) -> Any:
        """Return the tracker called ``name`` (its library object when ``unwrap``).

        On a process where that tracker does not run (the others of the main one), or before
        any tracker runs (as Accelerate's blank tracker), returns an `AbsentTracker` whose
        methods do nothing, so calling code needs no main-process guard. An unknown name
        raises on the main process once trackers run.
        """
        for tracker in self.trackers:
            if tracker.name == name:
                return getattr(tracker, "tracker", None) if unwrap else tracker
        if self.is_main_process and self.trackers:
            running = [t.name for t in self.trackers]
            raise ValueError(
                f"get_tracker({name!r}): no such tracker is running (running: {running}). "
                "Pass it in Accelerator(log_with=...) and call init_trackers() first."
            )
        return AbsentTracker(name)

    def log(
        self,
        values: Mapping[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Send ``values`` at ``step`` to every tracker running on this process.

        ``log_kwargs`` maps a tracker name to extra keyword arguments for its ``log``.
        """
        if not self.initialized or not self.trackers:
            # Only where a chosen tracker would run: like Accelerate's (main-process-only) log,
            # other processes may log without starting trackers (diffusers' example scripts
            # start them on the main process only and log on every process).
            chosen = [tracker_class(t) if isinstance(t, str) else t for t in self.log_with or ()]
            if not self.initialized and any(self._runs_here(t) for t in chosen):
                raise RuntimeError(
                    "accelerator.log() was called before init_trackers() (or after "
                    "end_training()): trackers "
                    f"{[getattr(t, 'name', t) for t in self.log_with]} are chosen but not "
                    "started. Call accelerator.init_trackers(project_name) first."
                )
            return
        if not isinstance(values, Mapping):
            raise TypeError(
                f"log() takes a dict of metric name -> value, got {type(values).__name__}: "
                f"{values!r:.80}."
            )
        payload = values if isinstance(values, dict) else dict(values)
        extra = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(payload, step=step, **extra.get(tracker.name, {}))

    def finish(self) -> None:
        """Finish every tracker (each one even if another fails); a second call does nothing.

        The finished trackers stay in `trackers` (as in Accelerate, where scripts read their
        files after end_training()); logging to them is refused until `init` starts new ones.
        """
        if not self.initialized:
            return
        trackers = self.trackers
        self._project_name, self._open = None, False
        errors: list[BaseException] = []
        for tracker in trackers:
            try:
                tracker.finish()
            except Exception as err:  # noqa: BLE001 - close the others, then re-raise
                errors.append(err)
        if errors:
            raise errors[0]

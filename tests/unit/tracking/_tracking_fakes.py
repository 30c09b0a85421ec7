"""A recording custom tracker, as a user would write one (shared by the tracking tests)."""

from __future__ import annotations

from typing import Any

from hasten.tracking.base import GeneralTracker

__all__ = ["RecordingTracker"]


class RecordingTracker(GeneralTracker):
    """A custom tracker that records every call, as a user-defined tracker would."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self, run_name: str = "run", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.calls: list[tuple[str, Any]] = []

    @property
    def tracker(self) -> list[tuple[str, Any]]:
        return self.calls

    def start(self) -> None:
        self.calls.append(("start", self.run_name))

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.calls.append(("config", values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", (values, step, kwargs)))

    def finish(self) -> None:
        self.calls.append(("finish", None))

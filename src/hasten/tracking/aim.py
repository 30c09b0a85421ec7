"""Aim tracker: one Aim run in a local repository (the logging directory)."""

from __future__ import annotations

import os
from typing import Any

from hasten.core.imports import require
from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner, to_scalar

__all__ = ["AimTracker"]


def _aim() -> Any:
    return require("aim", feature="The Aim tracker")  # optional: aim


class AimTracker(GeneralTracker):
    """Track metrics, images and hyperparameters in an Aim repository.

    Args:
        run_name: the run's display name.
        logging_dir: the Aim repository folder (``.aim`` is created inside).
        **kwargs: passed to ``aim.Run`` (e.g. ``experiment=...``, ``system_tracking_interval=None``).
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = os.fspath(logging_dir if logging_dir is not None else ".")
        self.init_kwargs = kwargs
        self.writer: Any = None
        self._skips = SkipWarner(self.name)

    def start(self) -> None:
        """Create the run in the repository."""
        self.writer = _aim().Run(repo=self.aim_repo_path, **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        """The ``aim.Run``."""
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` (nesting kept) under the run's ``hparams``."""
        self.writer["hparams"] = values

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Track each number as a metric at ``step`` (``context=...`` etc. via kwargs)."""
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is None:
                self._skips.skip(key, value)
            else:
                self.writer.track(scalar, name=key, step=step, **kwargs)

    def log_images(
        self,
        values: dict[str, Any],
        step: int | None = None,
        kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Track images; a value may be ``image`` or ``(image, caption)``.

        ``kwargs`` may hold ``{"aim_image": {...}, "track": {...}}`` for ``aim.Image`` and ``Run.track``.
        """
        aim = _aim()
        options = kwargs or {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            aim_image = aim.Image(image, caption=caption, **options.get("aim_image", {}))
            self.writer.track(aim_image, name=key, step=step, **options.get("track", {}))

    def finish(self) -> None:
        """Close the run."""
        if self.writer is not None:
            self.writer.close()

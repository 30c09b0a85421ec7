"""Trackio tracker: a local-first run (SQLite under ``TRACKIO_DIR``) per project."""

from __future__ import annotations

from typing import Any

from hasten.core.imports import require
from hasten.tracking.run import RunTracker
from hasten.tracking.values import check_table_input, to_scalar

__all__ = ["TrackioTracker"]


def _trackio() -> Any:
    return require("trackio", feature="The Trackio tracker")  # optional: trackio


class TrackioTracker(RunTracker):
    """Log to a Trackio run created with ``trackio.init(project=run_name, **kwargs)``.

    Args:
        run_name: the Trackio project.
        **kwargs: passed to ``trackio.init`` (``name=...``, ``space_id=...``, ``embed=False``).
    """

    name = "trackio"

    def start(self) -> None:
        """Create the Trackio run."""
        self.run = _trackio().init(project=self.run_name, **self.init_kwargs)

    def finish(self) -> None:
        """Finish the run and, when it is Trackio's current run, forget it as ``trackio.finish``
        does: else Trackio's exit hook finishes it again (and prints "Uploading logs") at exit.
        """
        if self.run is None:
            return
        trackio = _trackio()
        current = getattr(getattr(trackio, "context_vars", None), "current_run", None)
        if current is not None and current.get() is self.run:
            trackio.finish()
        else:  # another run was started since: leave that one current
            self.run.finish()

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` in the run's config."""
        self.run.config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log numbers, strings and Trackio media objects at ``step``; others are skipped."""
        clean: dict[str, Any] = {}
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is not None and not isinstance(value, bool):
                clean[key] = scalar
            elif isinstance(value, str | bool) or type(value).__module__.startswith("trackio"):
                clean[key] = value
            else:
                self._skips.skip(key, value, "numbers, strings or trackio media objects")
        self.run.log(clean, step=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log one image per key (array, PIL image or path); ``(image, caption)`` adds a caption."""
        trackio = _trackio()
        images = {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, None)
            images[key] = trackio.Image(image, caption=caption)
        self.run.log(images, step=step, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Log a ``trackio.Table`` built from ``columns`` + ``data`` or a pandas ``dataframe``."""
        check_table_input(table_name, data, dataframe)
        table = _trackio().Table(columns=columns, data=data, dataframe=dataframe)
        self.run.log({table_name: table}, step=step, **kwargs)

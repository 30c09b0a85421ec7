"""DVCLive tracker: metrics as TSV plots, params as YAML, in a local folder (``dir``, default "dvclive")."""

from __future__ import annotations

from typing import Any

from hasten.core.imports import require
from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner, to_scalar

__all__ = ["DVCLiveTracker"]


def _dvclive() -> Any:
    return require("dvclive", feature="The DVCLive tracker")  # optional: dvclive


class DVCLiveTracker(GeneralTracker):
    """Log to a ``dvclive.Live`` (created with ``**kwargs``, or the one passed as ``live``).

    Args:
        run_name: unused by DVCLive (kept for the common tracker signature).
        live: an existing ``dvclive.Live`` to log into.
        **kwargs: passed to ``dvclive.Live`` (``dir=...``, ``save_dvc_exp=False``, ...).
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.live = live
        self.init_kwargs = kwargs
        self._skips = SkipWarner(self.name)

    def start(self) -> None:
        """Create the ``Live`` unless one was given."""
        if self.live is None:
            self.live = _dvclive().Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``dvclive.Live``."""
        return self.live

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Write ``values`` (nesting kept) to the run's ``params.yaml``."""
        self.live.log_params(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` at ``step`` (DVCLive's own counter when None), then advance.

        Numbers (tensors included) and whatever else DVCLive's metrics take (strings) are logged;
        other values are skipped with a warning.
        """
        from dvclive.plots import Metric  # optional: dvclive (imported by start())

        live = self.live
        if step is not None:
            live.step = step
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is not None:
                live.log_metric(key, scalar, **kwargs)
            elif Metric.could_log(value):
                live.log_metric(key, value, **kwargs)
            else:
                self._skips.skip(key, value)
        live.next_step()

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Save each image (PIL, numpy array or path) as ``<key>`` under the run's plots."""
        if step is not None:
            self.live.step = step
        for key, image in values.items():
            self.live.log_image(key, image)

    def finish(self) -> None:
        """End the run (writes the summary and, if enabled, the DVC experiment)."""
        if self.live is not None:
            self.live.end()

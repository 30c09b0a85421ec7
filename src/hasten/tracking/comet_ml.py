"""Comet tracker: one Comet experiment per project (``online=False`` writes an offline archive)."""

from __future__ import annotations

from typing import Any

from hasten.core.imports import require
from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner, check_table_input, to_scalar

__all__ = ["CometMLTracker"]


def _comet_ml() -> Any:
    return require(
        "comet_ml", feature="The Comet tracker", pip_name="comet-ml"
    )  # optional: comet_ml


class CometMLTracker(GeneralTracker):
    """Log to a Comet experiment created with ``comet_ml.start(project_name=run_name, **kwargs)``.

    Args:
        run_name: the Comet project.
        **kwargs: passed to ``comet_ml.start`` (``online=False``, ``experiment_config=...``).
    """

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer: Any = None
        self._skips = SkipWarner(self.name)

    def start(self) -> None:
        """Start (or resume) the Comet experiment."""
        self.writer = _comet_ml().start(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The Comet experiment."""
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as parameters (Comet flattens nested dicts itself)."""
        self.writer.log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers become metrics, strings "others", dicts of numbers grouped metrics."""
        writer = self.writer
        if step is not None:
            writer.set_step(step)
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is not None:
                writer.log_metric(key, scalar, step=step, **kwargs)
            elif isinstance(value, str):
                writer.log_other(key, value)
            elif isinstance(value, dict) and all(to_scalar(v) is not None for v in value.values()):
                metrics = {name: to_scalar(v) for name, v in value.items()}
                writer.log_metrics(metrics, step=step, prefix=key, **kwargs)
            else:
                self._skips.skip(key, value, "numbers, strings or dicts of numbers")

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log each image (array, tensor, PIL image or path) under its key."""
        for key, image in values.items():
            self.writer.log_image(image, name=key, step=step, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Log a table (saved as ``table_name``, e.g. ``"preds.csv"``) from rows or a dataframe."""
        check_table_input(table_name, data, dataframe)
        if step is not None:
            self.writer.set_step(step)
        self.writer.log_table(
            table_name,
            tabular_data=dataframe if data is None else data,
            headers=columns or False,
            **kwargs,
        )

    def finish(self) -> None:
        """End the experiment (an offline one is archived to its zip file here)."""
        if self.writer is not None:
            self.writer.end()

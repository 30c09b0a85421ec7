"""ClearML tracker: one ClearML Task per project (``Task.set_offline(True)`` works without a server).

``CLEARML_PROJECT`` and ``CLEARML_TASK`` take precedence over the project name, as in Accelerate.
A Task the user already started with ``Task.init`` is reused and left open at the end.
"""

from __future__ import annotations

from typing import Any

from hasten.config import envvars
from hasten.core.imports import require
from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner, require_rows, to_scalar

__all__ = ["ClearMLTracker", "title_and_series"]

_SERIES_PREFIXES = ("eval", "test", "train")


def _clearml() -> Any:
    return require("clearml", feature="The ClearML tracker")  # optional: clearml


def title_and_series(key: str) -> tuple[str, str]:
    """Split ``"eval_loss"`` into ClearML's (title, series) = ("loss", "eval"); default series "train"."""
    for prefix in _SERIES_PREFIXES:
        if key.startswith(prefix + "_"):
            return key[len(prefix) + 1 :], prefix
    return key, "train"


class ClearMLTracker(GeneralTracker):
    """Report scalars, images, tables and configuration to a ClearML Task.

    Args:
        run_name: project and task name (unless CLEARML_PROJECT / CLEARML_TASK are set).
        **kwargs: passed to ``clearml.Task.init``.
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.user_provided_run_name = run_name
        self.init_kwargs = kwargs
        self.task: Any = None
        self._initialized_externally = False
        self._skips = SkipWarner(self.name)

    def start(self) -> None:
        """Reuse the current Task, or create one."""
        task_cls = _clearml().Task
        current = task_cls.current_task()
        if current is not None:
            self.task, self._initialized_externally = current, True
            return
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault(
            "project_name", envvars.read("CLEARML_PROJECT") or self.user_provided_run_name
        )
        kwargs.setdefault("task_name", envvars.read("CLEARML_TASK") or self.user_provided_run_name)
        self.task = task_cls.init(**kwargs)

    @property
    def tracker(self) -> Any:
        """The ClearML Task."""
        return self.task

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Attach ``values`` (nested dicts kept) as the Task's configuration."""
        self.task.connect_configuration(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Report numbers as scalars at ``step`` (as single values when ``step`` is None).

        Keys starting with ``eval_``/``test_``/``train_`` go to that series, others to "train".
        """
        logger = self.task.get_logger()
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is None:
                self._skips.skip(key, value)
            elif step is None:
                logger.report_single_value(name=key, value=scalar, **kwargs)
            else:
                title, series = title_and_series(key)
                logger.report_scalar(
                    title=title, series=series, value=scalar, iteration=step, **kwargs
                )

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Report each image (numpy array or PIL image) under its key."""
        logger = self.task.get_logger()
        for key, image in values.items():
            title, series = title_and_series(key)
            logger.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Report a table from rows (the first row is the header unless ``columns``) or a dataframe."""
        if dataframe is None:
            rows = require_rows(table_name, data)
            dataframe = [columns, *rows] if columns else rows
        title, series = title_and_series(table_name)
        self.task.get_logger().report_table(
            title=title, series=series, table_plot=dataframe, iteration=step, **kwargs
        )

    def finish(self) -> None:
        """Close the Task unless the user created it (then it is theirs to close)."""
        if self.task is not None and not self._initialized_externally:
            self.task.close()

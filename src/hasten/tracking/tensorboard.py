"""TensorBoard tracker: event files under ``<logging_dir>/<run_name>`` via torch's SummaryWriter
(or tensorboardX when only that is installed).
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

from hasten.core.imports import is_package_available, require
from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner, flatten_dict, require_rows, to_hparam, to_scalar

__all__ = ["TensorBoardTracker"]


def _writer_module() -> Any:
    if is_package_available("tensorboard"):
        return importlib.import_module("torch.utils.tensorboard")  # optional: tensorboard
    if is_package_available("tensorboardX"):
        return importlib.import_module("tensorboardX")  # optional: tensorboardX
    return require("tensorboard", feature="The TensorBoard tracker", extra="tensorboard")


class TensorBoardTracker(GeneralTracker):
    """Log scalars, text, images and hyperparameters to TensorBoard event files.

    Args:
        run_name: the project name; event files go to ``<logging_dir>/<run_name>``.
        logging_dir: parent folder of the run.
        **kwargs: passed to ``SummaryWriter`` (e.g. ``flush_secs``).
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(logging_dir, run_name)
        self.init_kwargs = kwargs
        self.writer: Any = None
        self._skips = SkipWarner(self.name)

    def start(self) -> None:
        """Open a SummaryWriter on ``<logging_dir>/<run_name>``."""
        self.writer = _writer_module().SummaryWriter(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter``."""
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Write ``values`` (flattened to ``a/b`` keys) to the HPARAMS tab, and hparams.yml.

        Into this run's own events (so TensorBoard shows them beside its metrics) and, as
        Accelerate does, into a ``<logging_dir>/<run_name>/<time>/`` sub-folder: the
        ``add_hparams`` events there and ``hparams.yml`` with ``values`` as given.
        """
        flat = {key: to_hparam(value) for key, value in flatten_dict(values).items()}
        summary = importlib.import_module(
            type(self.writer).__module__.rsplit(".", 1)[0] + ".summary"
        )
        writer = self.writer._get_file_writer()
        for proto in summary.hparams(flat, {}):
            writer.add_summary(proto)
        self.writer.flush()
        stamp = str(time.time())
        if type(self.writer).__module__.startswith("tensorboardX"):
            self.writer.add_hparams(flat, {}, name=stamp)
        else:
            self.writer.add_hparams(flat, {}, run_name=stamp)
        import yaml  # a core dependency; deferred like the writer

        folder = os.path.join(self.logging_dir, stamp)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hparams.yml"), "w", encoding="utf-8") as handle:
            yaml.dump(values, handle)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Write numbers as scalars, strings as text and dicts of numbers as grouped scalars."""
        writer = self.writer
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is not None:
                writer.add_scalar(key, scalar, global_step=step, **kwargs)
            elif isinstance(value, str):
                writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict) and all(to_scalar(v) is not None for v in value.values()):
                scalars = {k: to_scalar(v) for k, v in value.items()}
                writer.add_scalars(key, scalars, global_step=step, **kwargs)
            else:
                self._skips.skip(key, value, "numbers, strings or dicts of numbers")
        writer.flush()

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Write image batches (``N x C x H x W`` by default; pass ``dataformats`` to change)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Write a table as markdown text (TensorBoard's TEXT tab renders it as a table)."""
        if dataframe is not None:
            columns = [str(c) for c in dataframe.columns]
            data = dataframe.values.tolist()
        rows = [list(r) for r in require_rows(table_name, data)]
        header = (
            list(columns) if columns else [f"col{i}" for i in range(len(rows[0]) if rows else 0)]
        )
        lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
        self.writer.add_text(table_name, "\n".join(lines), global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        """Flush and close the event file."""
        if self.writer is not None:
            self.writer.close()

"""Weights & Biases tracker: one W&B run per project (``mode="offline"`` works without network)."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from hasten.core.imports import require
from hasten.tracking.run import RunTracker
from hasten.tracking.values import check_table_input, to_scalar

__all__ = ["WandBTracker"]


def _wandb() -> Any:
    return require("wandb", feature="The W&B tracker", extra="wandb")  # optional: wandb


def _loggable(value: Any) -> bool:
    """Whether W&B can serialise ``value``: numbers, text, arrays/tensors, its media objects, and
    dicts/lists of those."""
    if value is None or isinstance(value, str | numbers.Number | torch.Tensor):
        return True
    if type(value).__module__.split(".", 1)[0] in ("wandb", "numpy"):
        return True
    if isinstance(value, dict):
        return all(_loggable(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_loggable(v) for v in value)
    return False


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """One-element tensors become numbers; everything else (media, histograms) goes as is."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        scalar = to_scalar(value)
        out[key] = value if scalar is None or isinstance(value, bool) else scalar
    return out


class WandBTracker(RunTracker):
    """Log to a W&B run created with ``wandb.init(project=run_name, **kwargs)``.

    Args:
        run_name: the W&B project.
        **kwargs: passed to ``wandb.init`` (``mode="offline"``, ``dir=...``, ``tags=[...]``).
    """

    name = "wandb"

    def start(self) -> None:
        """Create the W&B run."""
        self.run = _wandb().init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` in the run's config (W&B keeps nesting)."""
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` at ``step``; W&B takes numbers, strings and its media objects."""
        payload = _plain(values)
        try:
            self.run.log(payload, step=step, **kwargs)
        except TypeError:
            # Only on failure: find what W&B cannot serialise, skip it (one warning per key).
            kept = {key: value for key, value in payload.items() if _loggable(value)}
            if len(kept) == len(payload):
                raise
            for key in payload.keys() - kept.keys():
                self._skips.skip(key, payload[key], "numbers, text, arrays and wandb media")
            self.run.log(kept, step=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log lists of images (arrays, tensors or PIL images) as ``wandb.Image``."""
        wandb = _wandb()
        images = {key: [wandb.Image(image) for image in batch] for key, batch in values.items()}
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
        """Log a ``wandb.Table`` built from ``columns`` + ``data`` or from a pandas ``dataframe``."""
        check_table_input(table_name, data, dataframe)
        table = _wandb().Table(columns=columns, data=data, dataframe=dataframe)
        self.run.log({table_name: table}, step=step, **kwargs)

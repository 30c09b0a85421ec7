"""SwanLab tracker: one SwanLab run per project (``mode="offline"`` or ``"local"`` needs no server)."""

from __future__ import annotations

from typing import Any

from hasten.core.imports import require
from hasten.tracking.run import RunTracker
from hasten.tracking.values import to_scalar

__all__ = ["SwanLabTracker"]


def _swanlab() -> Any:
    return require("swanlab", feature="The SwanLab tracker")  # optional: swanlab


class SwanLabTracker(RunTracker):
    """Log to a SwanLab run created with ``swanlab.init(project=run_name, **kwargs)``.

    Args:
        run_name: the SwanLab project.
        **kwargs: passed to ``swanlab.init`` (``mode="offline"``, ``logdir=...``, ...).
    """

    name = "swanlab"

    def start(self) -> None:
        """Create the SwanLab run."""
        self.run = _swanlab().init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` (nesting kept) in the run's config."""
        _swanlab().config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log numbers and SwanLab media objects at ``step``; others are skipped with a warning."""
        clean: dict[str, Any] = {}
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is not None:
                clean[key] = scalar
            elif type(value).__module__.startswith("swanlab"):
                clean[key] = value
            else:
                self._skips.skip(key, value, "numbers or swanlab media objects")
        self.run.log(clean, step=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log images (arrays, tensors or PIL images, or lists of them) as ``swanlab.Image``."""
        swanlab = _swanlab()
        images: dict[str, Any] = {}
        for key, value in values.items():
            batch = value if isinstance(value, list) else [value]
            images[key] = [swanlab.Image(image, **kwargs) for image in batch]
        self.run.log(images, step=step)

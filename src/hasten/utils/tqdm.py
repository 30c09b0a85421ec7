"""Compatibility path for ``accelerate.utils.tqdm``; the bar lives in `hasten.logging`."""

from hasten.logging import tqdm

__all__ = ["tqdm"]

"""Compatibility path for ``accelerate.parallelism_config``; the class lives in `hasten.config`."""

from hasten.config.parallelism import ParallelismConfig

__all__ = ["ParallelismConfig"]

"""Orchestration of a training run: prepare, accumulation, metrics, profiling.

Names resolve lazily from their modules, so the Accelerator loads only the pieces a run uses.
"""

from hasten.core.lazy import lazy_namespace

_TABLE: dict[str, list[str]] = {
    "hasten.training.accumulation": ["GradientAccumulator"],
    "hasten.training.metrics": ["gather_for_metrics"],
    "hasten.training.prepare": ["PreparedRegistry", "make_backward"],
    "hasten.training.profiling": ["profile"],
}

__getattr__, __dir__ = lazy_namespace(__name__, _TABLE, globals())

__all__ = sorted(name for names in _TABLE.values() for name in names)

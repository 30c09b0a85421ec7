"""Orchestration of a training run: prepare, accumulation, metrics, compilation, profiling."""

from hasten.training.accumulation import GradientAccumulator
from hasten.training.compile import compile_model, compile_regions
from hasten.training.metrics import gather_for_metrics
from hasten.training.prepare import PreparedRegistry, make_backward
from hasten.training.profiling import profile

__all__ = [
    "GradientAccumulator",
    "PreparedRegistry",
    "compile_model",
    "compile_regions",
    "gather_for_metrics",
    "make_backward",
    "profile",
]

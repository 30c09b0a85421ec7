"""Numeric policy of a run: full precision, or fp16/bf16 autocast with loss scaling."""

from hasten.precision.amp import (
    AmpPrecision,
    AutocastForward,
    get_grad_scaler,
    get_mixed_precision_context_manager,
)
from hasten.precision.base import Precision
from hasten.precision.select import select_precision

__all__ = [
    "AmpPrecision",
    "AutocastForward",
    "Precision",
    "get_grad_scaler",
    "get_mixed_precision_context_manager",
    "select_precision",
]

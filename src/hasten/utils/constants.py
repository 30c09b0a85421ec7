"""Compatibility path for ``accelerate.utils.constants``; the names live in `hasten.core.constants`."""

from hasten.big_modeling.casting import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from hasten.core.constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

__all__ = [
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
]

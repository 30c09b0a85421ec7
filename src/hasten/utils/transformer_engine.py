"""Compatibility path for ``accelerate.utils.transformer_engine``; see `hasten.precision.transformer_engine`."""

from hasten.precision.transformer_engine import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)

__all__ = [
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
]

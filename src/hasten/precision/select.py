"""Choose the `Precision` once, from what the user asked for and where the run computes.

All validation of ``mixed_precision`` happens here, before any model is touched, so a bad
request fails at `Accelerator(...)` with a message saying what is allowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hasten.config.enums import PrecisionType, parse_mixed_precision
from hasten.core.versions import is_torch_version
from hasten.platforms.checks import is_bf16_available
from hasten.precision.amp import AmpPrecision, make_grad_scaler
from hasten.precision.base import Precision

if TYPE_CHECKING:
    from hasten.config.kwargs import AutocastKwargs, FP8Recipe, GradScalerKwargs

__all__ = ["FP16_DEVICE_TYPES", "select_precision"]

# Device types with fp16 autocast and a GradScaler in torch (CPU since torch 2.3).
FP16_DEVICE_TYPES = ("cuda", "xpu", "npu", "mlu", "musa", "hpu", "sdaa", "mps", "cpu")

# bf16 autocast needs no capability check on these.
_BF16_ALWAYS = ("cpu", "xpu", "hpu")


def _normalise(mixed_precision: Any) -> str:
    if mixed_precision is None:
        return "no"
    return parse_mixed_precision(
        mixed_precision,
        "select_precision(mixed_precision=...)",
        "pass one of them (or set ACCELERATE_MIXED_PRECISION to one of them)",
    )


def _check_device(value: str, device_type: str) -> None:
    if value == "fp16" and device_type not in FP16_DEVICE_TYPES:
        raise ValueError(
            f"mixed_precision='fp16' is not supported on device type {device_type!r}; it needs "
            f"one of {list(FP16_DEVICE_TYPES)}. Use mixed_precision='no' (or 'bf16' where "
            "supported) on this device."
        )
    if value == "bf16" and device_type not in _BF16_ALWAYS and not is_bf16_available(True):
        raise ValueError(
            f"mixed_precision='bf16' is not supported on this {device_type!r} device; use "
            "mixed_precision='fp16' or 'no'."
        )
    if device_type == "mps":
        needed = "2.5.0" if value == "fp16" else "2.6.0"
        if not is_torch_version(">=", needed):
            raise ValueError(
                f"mixed_precision={value!r} on MPS needs torch >= {needed} (found "
                f"{torch.__version__!r}); upgrade torch or use mixed_precision='no'."
            )


def select_precision(
    mixed_precision: PrecisionType | str | None,
    device: torch.device | str,
    *,
    autocast_kwargs: AutocastKwargs | None = None,
    scaler_kwargs: GradScalerKwargs | None = None,
    sharded_scaler: bool = False,
    engine_managed: bool = False,
    fp8_recipe: FP8Recipe | None = None,
) -> Precision:
    """Return the precision policy for a run.

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (or a `PrecisionType`;
            None means ``"no"``).
        device: the device the model computes on.
        autocast_kwargs: an `AutocastKwargs` handler.
        scaler_kwargs: a `GradScalerKwargs` handler (fp16).
        sharded_scaler: fp16 scales flat sharded gradients (FSDP1: torch's `ShardedGradScaler`).
        engine_managed: the strategy's engine (DeepSpeed, Megatron-LM) handles precision
            itself; the policy then only carries the label.
        fp8_recipe: the fp8 recipe handler (`AORecipeKwargs`, `TERecipeKwargs`, ...), if any.

    Raises:
        ValueError: an unknown value, a precision the device does not support, an fp8 recipe
            without mixed_precision='fp8' or for another backend than the selected one.
        ImportError: fp8 without its backend's package.
    """
    value = _normalise(mixed_precision)
    if engine_managed:
        return Precision(value)
    if fp8_recipe is not None and value != "fp8":
        raise ValueError(
            f"An fp8 recipe ({type(fp8_recipe).__name__}) was passed in kwargs_handlers but "
            f"mixed_precision is {value!r}; pass mixed_precision='fp8' (or --mixed_precision fp8) "
            "to train in fp8, or drop the recipe."
        )
    if value == "fp8":
        from hasten.precision.fp8 import select_fp8  # its recipes' config loads only for fp8 runs

        return select_fp8(device, fp8_recipe, autocast_kwargs)
    if value == "no":
        return Precision(value)
    device_type = torch.device(device).type
    _check_device(value, device_type)
    scaler = None
    if value == "fp16":
        options = scaler_kwargs.to_kwargs() if scaler_kwargs is not None else {}
        scaler = make_grad_scaler(device_type, sharded=sharded_scaler, **options)
    return AmpPrecision(value, device_type, autocast_kwargs=autocast_kwargs, scaler=scaler)

"""BnbQuantizationConfig: how bitsandbytes quantizes a model loaded for inference (8 or 4 bit).

Validation only; bitsandbytes is imported by the loader that uses this config.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from hasten.config.enums import CustomDtype

__all__ = ["BnbQuantizationConfig"]

_QUANT_TYPES = ("fp4", "nf4")
_DTYPE_NAMES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"BnbQuantizationConfig({name}={value!r}) must be a bool")


def _dtype(name: str, value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        if value in _DTYPE_NAMES:
            return _DTYPE_NAMES[value]
        raise ValueError(
            f"BnbQuantizationConfig({name}={value!r}) must be one of {list(_DTYPE_NAMES)} or a "
            "torch.dtype"
        )
    raise TypeError(
        f"BnbQuantizationConfig({name}={value!r}) must be one of {list(_DTYPE_NAMES)} or a "
        "torch.dtype"
    )


def _check_names(name: str, value: Any) -> None:
    if value is not None and (
        not isinstance(value, list) or not all(isinstance(item, str) for item in value)
    ):
        raise TypeError(f"BnbQuantizationConfig({name}={value!r}) must be a list of module names")


@dataclasses.dataclass
class BnbQuantizationConfig:
    """Quantize a model with bitsandbytes: exactly one of `load_in_8bit` / `load_in_4bit`.

    Args:
        load_in_8bit: LLM.int8() quantization.
        llm_int8_threshold: outlier threshold (8-bit only).
        load_in_4bit: 4-bit quantization.
        bnb_4bit_quant_type: "fp4" or "nf4".
        bnb_4bit_use_double_quant: quantize the quantization constants again.
        bnb_4bit_compute_dtype: "fp32", "fp16", "bf16" or a torch dtype used for compute.
        torch_dtype: dtype of the layers left unquantized (default fp16 for 8-bit, the compute
            dtype for 4-bit).
        skip_modules: modules not quantized (kept in `torch_dtype`).
        keep_in_fp32_modules: modules not quantized and kept in float32.

    Example:
        >>> BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16").torch_dtype
        torch.bfloat16
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: str = "fp16"
    torch_dtype: torch.dtype = None  # type: ignore[assignment]
    skip_modules: list[str] = None  # type: ignore[assignment]
    keep_in_fp32_modules: list[str] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            _check_bool(name, getattr(self, name))
        if self.load_in_8bit == self.load_in_4bit:
            raise ValueError(
                f"BnbQuantizationConfig(load_in_8bit={self.load_in_8bit}, load_in_4bit="
                f"{self.load_in_4bit}): set exactly one of them to True"
            )
        threshold: Any = self.llm_int8_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError(
                f"BnbQuantizationConfig(llm_int8_threshold={threshold!r}) must be a number"
            )
        if self.bnb_4bit_quant_type not in _QUANT_TYPES:
            raise ValueError(
                f"BnbQuantizationConfig(bnb_4bit_quant_type={self.bnb_4bit_quant_type!r}) must be "
                f"one of {list(_QUANT_TYPES)}"
            )
        self.bnb_4bit_compute_dtype = _dtype("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype)  # type: ignore[assignment]
        _check_names("skip_modules", self.skip_modules)
        _check_names("keep_in_fp32_modules", self.keep_in_fp32_modules)
        self.target_dtype: torch.dtype | CustomDtype = (
            torch.int8 if self.load_in_8bit else CustomDtype.INT4
        )
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn(
                "BnbQuantizationConfig(llm_int8_threshold=...) only applies to 8-bit loading; it "
                "is ignored with load_in_4bit=True",
                UserWarning,
                stacklevel=3,
            )
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        else:
            self.torch_dtype = _dtype("torch_dtype", self.torch_dtype)

"""config.quantization: BnbQuantizationConfig validation and dtype resolution."""

from __future__ import annotations

import pytest
import torch

from hasten.config.enums import CustomDtype
from hasten.config.quantization import BnbQuantizationConfig


def test_8bit_defaults() -> None:
    config = BnbQuantizationConfig(load_in_8bit=True)
    assert config.torch_dtype == torch.float16
    assert config.target_dtype == torch.int8
    assert config.bnb_4bit_compute_dtype == torch.float16


def test_4bit_uses_the_compute_dtype() -> None:
    config = BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="bf16"
    )
    assert config.torch_dtype == torch.bfloat16
    assert config.target_dtype is CustomDtype.INT4


def test_explicit_torch_dtype_by_name_or_dtype() -> None:
    assert BnbQuantizationConfig(load_in_8bit=True, torch_dtype="fp32").torch_dtype == torch.float32  # type: ignore[arg-type]
    assert (
        BnbQuantizationConfig(load_in_4bit=True, torch_dtype=torch.bfloat16).torch_dtype
        == torch.bfloat16
    )


def test_threshold_with_4bit_warns() -> None:
    with pytest.warns(UserWarning, match="only applies to 8-bit loading"):
        BnbQuantizationConfig(load_in_4bit=True, llm_int8_threshold=5.0)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({}, ValueError, r"load_in_8bit=False, load_in_4bit=False\): set exactly one"),
        ({"load_in_8bit": True, "load_in_4bit": True}, ValueError, "set exactly one"),
        ({"load_in_8bit": 1}, TypeError, r"load_in_8bit=1\) must be a bool"),
        (
            {"load_in_8bit": True, "bnb_4bit_use_double_quant": "yes"},
            TypeError,
            "bnb_4bit_use_double_quant='yes'",
        ),
        (
            {"load_in_8bit": True, "llm_int8_threshold": "6"},
            TypeError,
            r"llm_int8_threshold='6'\) must be a number",
        ),
        (
            {"load_in_4bit": True, "bnb_4bit_quant_type": "np4"},
            ValueError,
            r"bnb_4bit_quant_type='np4'\) must be one of \['fp4', 'nf4'\]",
        ),
        (
            {"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp64"},
            ValueError,
            r"bnb_4bit_compute_dtype='fp64'\) must be one of \['fp32', 'fp16', 'bf16'\]",
        ),
        (
            {"load_in_4bit": True, "bnb_4bit_compute_dtype": 16},
            TypeError,
            r"bnb_4bit_compute_dtype=16\)",
        ),
        ({"load_in_8bit": True, "torch_dtype": "half"}, ValueError, r"torch_dtype='half'\)"),
        (
            {"load_in_8bit": True, "skip_modules": "lm_head"},
            TypeError,
            r"skip_modules='lm_head'\) must be a list",
        ),
        (
            {"load_in_8bit": True, "keep_in_fp32_modules": [1]},
            TypeError,
            r"keep_in_fp32_modules=\[1\]\)",
        ),
    ],
)
def test_errors(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        BnbQuantizationConfig(**options)

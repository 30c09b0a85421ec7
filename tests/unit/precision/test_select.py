"""select_precision: one decision, clear errors."""

from __future__ import annotations

import pytest
import torch

from hasten.config.enums import PrecisionType
from hasten.precision import AmpPrecision, Precision, select_precision


@pytest.mark.parametrize("value", [None, "no", "NO", PrecisionType("no")])
def test_full_precision(value: object) -> None:
    precision = select_precision(value, "cpu")
    assert type(precision) is Precision
    assert precision.mixed_precision == "no"


@pytest.mark.parametrize("value", ["bf16", PrecisionType("bf16"), "fp16"])
def test_mixed_precision(value: object) -> None:
    precision = select_precision(value, torch.device("cpu"))
    assert isinstance(precision, AmpPrecision)
    assert precision.native_amp


def test_engine_managed_precision_is_a_label_only() -> None:
    precision = select_precision("fp16", "cpu", engine_managed=True)
    assert type(precision) is Precision
    assert precision.mixed_precision == "fp16" and precision.scaler is None


def test_unknown_value() -> None:
    with pytest.raises(
        ValueError,
        match=r"Unknown mixed_precision 'fp32' \(from select_precision.*\['no', 'fp8', 'fp16', 'bf16'\]",
    ):
        select_precision("fp32", "cpu")


def test_fp16_where_unsupported() -> None:
    with pytest.raises(
        ValueError, match=r"mixed_precision='fp16' is not supported on device type 'meta'"
    ):
        select_precision("fp16", "meta")


def test_fp8_on_cpu_names_the_hardware_and_bf16() -> None:
    with pytest.raises((ValueError, ImportError), match=r"mixed_precision='bf16'"):
        select_precision("fp8", "cpu")

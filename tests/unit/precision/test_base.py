"""Precision (fp32): every hook is a no-op."""

from __future__ import annotations

import torch

from hasten.precision import Precision


def test_fp32_changes_nothing() -> None:
    precision = Precision()
    model = torch.nn.Linear(2, 2)
    forward = model.forward
    assert precision.wrap_forward(model) is model
    assert model.forward == forward
    with precision.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert precision.state_dict() == {}
    assert precision.scaler is None and not precision.native_amp


def test_label_for_engine_managed_precision() -> None:
    assert Precision("bf16").mixed_precision == "bf16"
    assert "bf16" in repr(Precision("bf16"))

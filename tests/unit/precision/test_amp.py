"""AmpPrecision on CPU: bf16/fp16 autocast, fp32 outputs, grad scaler, picklable models."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from hasten.config.kwargs import AutocastKwargs, GradScalerKwargs
from hasten.precision import AmpPrecision, AutocastForward, get_grad_scaler, select_precision
from hasten.precision.amp import get_mixed_precision_context_manager, make_grad_scaler
from hasten.strategies.unwrap import extract_model_from_parallel


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


class Probe(torch.nn.Module):
    """Returns the dtype its matmul ran in, as well as the result."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, str]:
        out = self.linear(x)
        return out, str(out.dtype)


@pytest.mark.parametrize(("mp", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_runs_matmuls_in_half_precision(mp: str, dtype: torch.dtype) -> None:
    precision = select_precision(mp, "cpu")
    with precision.autocast():
        assert (torch.randn(2, 3) @ torch.randn(3, 2)).dtype == dtype
    model = precision.wrap_forward(Probe())
    out, inner_dtype = model(torch.randn(2, 4))
    assert inner_dtype == str(dtype)
    assert out.dtype == torch.float32  # converted back for the loss


def test_autocast_kwargs_are_honoured() -> None:
    precision = select_precision("bf16", "cpu", autocast_kwargs=AutocastKwargs(enabled=False))
    model = precision.wrap_forward(Probe())
    assert model(torch.randn(1, 4))[1] == "torch.float32"
    with precision.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with precision.autocast(AutocastKwargs(enabled=True)):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_nested_autocast_contexts_restore_the_outer_state() -> None:
    precision = select_precision("bf16", "cpu")
    model = precision.wrap_forward(Probe())
    with precision.autocast():
        model(torch.randn(1, 4))
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


def test_wrapped_model_pickles_and_unwraps() -> None:
    precision = select_precision("bf16", "cpu")
    model = precision.wrap_forward(_model())
    assert isinstance(model.forward, AutocastForward)
    x = torch.randn(3, 4)
    expected = model(x)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert isinstance(clone.forward, AutocastForward)
        assert torch.equal(clone(x), expected)
    extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in model.__dict__ and "_original_forward" not in model.__dict__
    assert model(x).dtype == torch.float32


def test_fp16_scaler_scales_the_loss_and_skips_overflowing_steps() -> None:
    precision = select_precision("fp16", "cpu", scaler_kwargs=GradScalerKwargs(init_scale=256.0))
    assert isinstance(precision.scaler, torch.amp.GradScaler)
    weight = torch.ones(2, requires_grad=True)
    assert precision.scaler is not None
    precision.scaler.scale((weight * 1.0).sum()).backward()
    assert weight.grad is not None and weight.grad.tolist() == [256.0, 256.0]
    optimizer = torch.optim.SGD([weight], lr=1.0)
    precision.unscale_(optimizer)
    assert weight.grad.tolist() == [1.0, 1.0]
    state = precision.state_dict()
    assert state["scale"] == 256.0
    other = select_precision("fp16", "cpu")
    other.load_state_dict(state)
    assert other.scaler is not None and other.scaler.get_scale() == 256.0


def test_bf16_has_no_scaler() -> None:
    precision = select_precision("bf16", "cpu")
    assert precision.scaler is None
    assert precision.state_dict() == {}


def test_amp_precision_rejects_other_values() -> None:
    with pytest.raises(
        ValueError, match=r"AmpPrecision\(mixed_precision='no'\) must be 'fp16' or 'bf16'"
    ):
        AmpPrecision("no", "cpu")


def test_grad_scaler_helpers() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from hasten.config.enums import DistributedType

    scaler = get_grad_scaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 8.0
    assert make_grad_scaler("cpu", growth_interval=3).get_growth_interval() == 3
    assert isinstance(make_grad_scaler("cpu", DistributedType("FSDP")), ShardedGradScaler)


def test_mixed_precision_context_manager_follows_the_state() -> None:
    from hasten.state import AcceleratorState

    assert not torch.is_autocast_enabled("cpu")
    with get_mixed_precision_context_manager(native_amp=False):
        assert not torch.is_autocast_enabled("cpu")
    AcceleratorState(mixed_precision="bf16", cpu=True, _from_accelerator=True)
    with get_mixed_precision_context_manager(native_amp=True):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with get_mixed_precision_context_manager(True, AutocastKwargs(enabled=False)):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32

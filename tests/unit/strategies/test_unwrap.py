from __future__ import annotations

import pickle

import torch
from torch import nn

from hasten.strategies.unwrap import (
    extract_model_from_parallel,
    is_compiled_module,
    parallel_containers,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Fp32Forward:
    """Stands in for the mixed-precision wrapper (keeps `_original_forward` by convention)."""

    def __init__(self, forward):  # type: ignore[no-untyped-def]
        self.forward = forward

    def __call__(self, *args):  # type: ignore[no-untyped-def]
        return self.forward(*args).double()


def test_dataparallel_is_unwrapped() -> None:
    net = Net()
    assert extract_model_from_parallel(nn.DataParallel(net)) is net
    assert nn.parallel.DistributedDataParallel in parallel_containers()


def test_plain_model_passes_through() -> None:
    net = Net()
    assert extract_model_from_parallel(net) is net


def test_fp32_wrapper_kept_or_removed() -> None:
    net = Net()
    net._original_forward = net.forward
    net.forward = Fp32Forward(net.forward)
    x = torch.ones(1, 2)
    assert extract_model_from_parallel(net, keep_fp32_wrapper=True)(x).dtype == torch.float64
    out = extract_model_from_parallel(net, keep_fp32_wrapper=False)
    assert out(x).dtype == torch.float32
    assert "forward" not in out.__dict__
    assert "_original_forward" not in out.__dict__
    pickle.dumps(out)


def test_compiled_wrapper_kept_or_dropped() -> None:
    net = Net()
    compiled = torch.compile(nn.DataParallel(net), backend="eager")
    assert is_compiled_module(compiled)
    assert not is_compiled_module(net)
    kept = extract_model_from_parallel(compiled)
    assert is_compiled_module(kept)
    assert kept._orig_mod is net
    # The user's compiled DataParallel is left untouched.
    assert isinstance(compiled._orig_mod, nn.DataParallel)
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is net
    plain = torch.compile(net, backend="eager")
    assert extract_model_from_parallel(plain) is plain


def test_recursive_unwraps_children() -> None:
    outer = nn.Sequential(nn.DataParallel(Net()))
    out = extract_model_from_parallel(outer, recursive=True)
    assert isinstance(out[0], Net)


def test_is_peft_model_false_for_plain_and_wrapped_models() -> None:
    import torch.nn as tnn

    from hasten.strategies.unwrap import is_peft_model

    assert is_peft_model(tnn.Linear(2, 2)) is False

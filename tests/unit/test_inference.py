"""hasten.inference in one process: device-map planning, batch discovery, argument checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hasten
from hasten.inference import (
    find_pippy_batch_size,
    generate_device_map,
    pippy_forward,
    prepare_pippy,
)


def _stack(n: int = 6) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(n)])


@pytest.mark.parametrize("processes", [2, 3])
def test_generate_device_map_balances_every_module_over_the_processes(processes: int) -> None:
    device_map = generate_device_map(_stack(), num_processes=processes)
    devices = list(device_map.values())
    assert set(devices) == set(range(processes))  # nothing on cpu/disk, every stage used
    assert devices == sorted(devices)  # contiguous stages in module order
    counts = [devices.count(i) for i in range(processes)]
    assert max(counts) - min(counts) <= 2


def test_generate_device_map_with_given_budgets_and_single_process() -> None:
    model = _stack(4)
    device_map = generate_device_map(model, 2, max_memory={0: 2400, 1: 10**6})
    assert device_map["0"] == 0 and device_map["3"] == 1
    assert "0" in generate_device_map(model)


def test_find_pippy_batch_size_reads_args_then_kwargs() -> None:
    assert find_pippy_batch_size((torch.zeros(3, 2),), None) == 3
    assert find_pippy_batch_size((), {"ids": torch.zeros(5, 1)}) == 5
    assert find_pippy_batch_size(("text",), {"ids": torch.zeros(2)}) == 2
    assert find_pippy_batch_size((), None) is None


def test_one_process_keeps_the_whole_model_and_its_outputs() -> None:
    model = _stack(3)
    x = torch.randn(4, 16)
    expected = model(x)
    prepared = hasten.prepare_pippy(model, split_points=["1"], example_args=(x,))
    assert prepared is model and prepared.hf_split_points == ["1"]
    torch.testing.assert_close(prepared(x), expected)
    assert prepared.forward.__wrapped__ == prepared._original_forward
    assert pippy_forward(lambda t: t * 2, 1, False, torch.ones(1)).item() == 2


def test_bad_arguments_raise_clear_errors() -> None:
    x = (torch.randn(2, 16),)
    with pytest.raises(ValueError, match="num_chunks must be a positive int"):
        prepare_pippy(_stack(), example_args=x, num_chunks=0)
    with pytest.raises(ValueError, match="split_points must be 'auto' or a list"):
        prepare_pippy(_stack(), split_points=None, example_args=x)
    with pytest.raises(ValueError, match="at least one tensor"):
        prepare_pippy(_stack(), split_points=["1"], example_args=("no tensor",))

"""Hooks: wrapping keeps the module usable; AlignDevicesHook loads weights just in time."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch import nn

from hasten.big_modeling.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)


class Scale(nn.Module):
    def forward(self, x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        return x * factor


class AddOne(ModelHook):
    def __init__(self, log: list[str], tag: str) -> None:
        self.log, self.tag = log, tag

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        self.log.append(f"pre {self.tag}")
        return (args[0] + 1, *args[1:]), kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        self.log.append(f"post {self.tag}")
        return output


def test_hook_wraps_forward_and_keeps_the_signature() -> None:
    module = Scale()
    log: list[str] = []
    add_hook_to_module(module, AddOne(log, "a"))
    assert list(inspect.signature(module.forward).parameters) == ["x", "factor"]
    assert torch.equal(module(torch.zeros(1), factor=3.0), torch.tensor([3.0]))
    assert log == ["pre a", "post a"]
    add_hook_to_module(module, AddOne(log, "b"), append=True)
    assert isinstance(module._hf_hook, SequentialHook)
    log.clear()
    assert torch.equal(module(torch.zeros(1)), torch.tensor([4.0]))
    assert log == ["pre a", "pre b", "post a", "post b"]
    add_hook_to_module(module, AddOne(log, "c"))  # replaces, not stacks
    assert torch.equal(module(torch.zeros(1)), torch.tensor([2.0]))


def test_remove_hook_restores_the_class_forward() -> None:
    module = nn.Sequential(Scale(), Scale())
    for child in module:
        add_hook_to_module(child, AddOne([], "x"))
    remove_hook_from_module(module, recurse=True)
    assert "forward" not in module[0].__dict__ and not hasattr(module[0], "_hf_hook")
    assert torch.equal(module(torch.ones(1)), torch.tensor([4.0]))
    with pytest.raises(TypeError, match="ModelHook"):
        add_hook_to_module(module, object())  # type: ignore[arg-type]


def test_no_grad_hook_and_torch_no_grad() -> None:
    layer = nn.Linear(2, 2)

    class NoGrad(ModelHook):
        no_grad = True

    add_hook_to_module(layer, NoGrad())
    assert not layer(torch.ones(1, 2)).requires_grad
    add_hook_to_module(layer, ModelHook())
    assert layer(torch.ones(1, 2)).requires_grad
    with torch.no_grad():
        assert not layer(torch.ones(1, 2)).requires_grad


def test_align_devices_hook_offloads_between_forwards() -> None:
    seen: list[bool] = []

    class Spy(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(self.weight.is_meta)
            return super().forward(x)

    layer = Spy(3, 2)
    weight = layer.weight.detach().clone()
    x = torch.randn(4, 3)
    want = layer(x)
    seen.clear()
    hook = AlignDevicesHook(execution_device="cpu", offload=True, io_same_device=True)
    add_hook_to_module(layer, hook)
    assert layer.weight.is_meta and "weight" in hook.weights_map
    assert torch.equal(layer(x), want)
    assert layer.weight.is_meta and seen == [False]
    remove_hook_from_module(layer)
    assert torch.equal(layer.weight, weight)
    assert "execution_device=cpu" in repr(hook)


def test_align_devices_hook_uses_a_given_weights_map_and_skip_keys() -> None:
    layer = nn.Linear(2, 2)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    hook = AlignDevicesHook("cpu", offload=True, weights_map=state, skip_keys="keep")
    add_hook_to_module(layer, hook)
    assert layer.bias.is_meta
    out = layer(torch.ones(1, 2))
    assert torch.allclose(out, torch.ones(1, 2) @ state["weight"].T + state["bias"])
    args, kwargs = hook.pre_forward(layer, torch.ones(1), keep={"a": 1})
    assert kwargs == {"keep": {"a": 1}}
    hook.post_forward(layer, None)


def test_attach_hooks_on_blocks_and_execution_device() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    x = torch.randn(3, 2)
    want = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attach_align_device_hook_on_blocks(
        model,
        execution_device={"0": "cpu", "1": "cpu"},
        offload={"0": False, "1": True},
        weights_map=state,
    )
    assert not model[0].weight.is_meta and model[1][0].weight.is_meta
    assert torch.equal(model(x), want)
    remove_hook_from_submodules(model)
    attach_align_device_hook_on_blocks(model, execution_device="cpu", offload=False)
    assert model._hf_hook.io_same_device
    remove_hook_from_submodules(model)
    attach_execution_device_hook(model, "cpu")
    assert isinstance(model[1][0]._hf_hook, AlignDevicesHook) and not hasattr(
        model[1][1], "_hf_hook"
    )
    remove_hook_from_submodules(model)
    attach_align_device_hook(
        model, "cpu", offload=True, weights_map=state, preload_module_classes=["Sequential"]
    )
    assert model._hf_hook.place_submodules and not hasattr(model[0], "_hf_hook")
    assert torch.equal(model(x), want)


def test_cpu_offload_hook_moves_to_the_execution_device() -> None:
    layer = nn.Linear(2, 2)
    hook = CpuOffload(execution_device="cpu")
    add_hook_to_module(layer, hook)
    user = UserCpuOffloadHook(layer, hook)
    assert layer(torch.ones(1, 2)).shape == (1, 2)
    user.offload()
    assert layer.weight.device.type == "cpu"
    user.remove()
    assert not hasattr(layer, "_hf_hook")
    assert CpuOffload().execution_device.type in ("cpu", "cuda", "xpu", "mps", "npu")


def test_offload_without_execution_device_runs_on_cpu() -> None:
    layer = nn.Linear(2, 2)
    x = torch.randn(1, 2)
    want = layer(x)
    add_hook_to_module(layer, AlignDevicesHook(offload=True))
    assert layer.weight.is_meta
    assert torch.equal(layer(x), want)

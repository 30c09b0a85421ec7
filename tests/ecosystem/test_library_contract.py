"""What transformers, trl, peft and diffusers read of ``accelerate`` beyond its public API.

Through the ``accelerate`` name (hasten's alias): the private names they call, the hook classes
they look up by class name on ``accelerate.hooks``, and the classes they test with isinstance.
Each must keep working: a rename in hasten would break those libraries silently.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from torch import nn

from _support.ecosystem import require_alias


@pytest.fixture
def accelerate() -> Any:
    require_alias()
    return importlib.import_module("accelerate")


def test_private_state_names(accelerate: Any) -> None:
    from accelerate.state import AcceleratorState, GradientState, PartialState

    accelerator = accelerate.Accelerator(cpu=True)
    partial = PartialState()
    assert PartialState._shared_state is partial.__dict__  # transformers reads it
    assert PartialState._shared_state["device"] == torch.device("cpu")
    gradient = GradientState()
    gradient._set_sync_gradients(False)  # trl, transformers
    assert accelerator.sync_gradients is False
    gradient._set_sync_gradients(True)
    model = accelerator.prepare(nn.Linear(2, 2))
    assert accelerator._models == [model]  # transformers: len(self.accelerator._models)
    AcceleratorState._reset_state(reset_partial_state=True)  # transformers' tests and trl
    assert AcceleratorState._shared_state == {} and PartialState._shared_state == {}
    PartialState()
    PartialState._reset_state()
    assert PartialState._shared_state == {}


def test_hooks_are_found_by_class_name_and_isinstance(accelerate: Any) -> None:
    import accelerate.hooks as hooks
    from accelerate import cpu_offload, cpu_offload_with_hook

    model = cpu_offload(nn.Sequential(nn.Linear(2, 2)), execution_device=torch.device("cpu"))
    hook = model[0]._hf_hook  # transformers and peft read module._hf_hook
    assert isinstance(hook, hooks.AlignDevicesHook)
    # transformers' and peft's quantizer code: getattr(accelerate.hooks, type(hook).__name__)
    assert getattr(hooks, type(hook).__name__) is type(hook)
    assert getattr(hooks, type(model._hf_hook).__name__) is type(model._hf_hook)
    _, user_hook = cpu_offload_with_hook(nn.Linear(2, 2))
    assert isinstance(user_hook.hook, hooks.CpuOffload)
    hooks.remove_hook_from_submodules(model)
    assert not hasattr(model[0], "_hf_hook")


def test_deepspeed_classes_for_isinstance(accelerate: Any) -> None:
    from accelerate.utils import DeepSpeedSchedulerWrapper, DummyOptim, DummyScheduler

    import hasten.utils

    params = list(nn.Linear(2, 2).parameters())
    optimizer = DummyOptim(params, lr=1e-3)
    assert isinstance(optimizer, hasten.utils.DummyOptim)  # Trainer tests isinstance(DummyOptim)
    assert isinstance(DummyScheduler(optimizer), hasten.utils.DummyScheduler)
    assert DeepSpeedSchedulerWrapper is hasten.utils.DeepSpeedSchedulerWrapper
    sgd = torch.optim.SGD(params, lr=0.1)
    wrapped = DeepSpeedSchedulerWrapper(torch.optim.lr_scheduler.StepLR(sgd, 1), [sgd])
    assert isinstance(wrapped, hasten.utils.DeepSpeedSchedulerWrapper)

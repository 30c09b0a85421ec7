"""AcceleratedOptimizer: sync-gated steps, the fp16 scaler path, skipped-step detection, pickling."""

from __future__ import annotations

import pickle

import pytest
import torch

from hasten.optimizer import AcceleratedOptimizer, move_to_device
from hasten.state import GradientState


def _setup(
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[torch.nn.Parameter, AcceleratedOptimizer]:
    weight = torch.nn.Parameter(torch.ones(2))
    return weight, AcceleratedOptimizer(torch.optim.SGD([weight], lr=0.5), scaler=scaler)


def test_is_an_optimizer_and_steps() -> None:
    weight, optimizer = _setup()
    assert isinstance(optimizer, torch.optim.Optimizer)
    weight.sum().backward()
    optimizer.step()
    assert weight.tolist() == [0.5, 0.5]
    optimizer.zero_grad()
    assert weight.grad is None  # set_to_none by default
    assert not optimizer.step_was_skipped


def test_no_step_or_zero_grad_while_accumulating() -> None:
    weight, optimizer = _setup()
    state = GradientState()
    weight.sum().backward()
    state._set_sync_gradients(False)
    optimizer.step()
    optimizer.zero_grad()
    assert weight.tolist() == [1.0, 1.0]
    assert weight.grad is not None
    state._set_sync_gradients(True)
    optimizer.step()
    assert weight.tolist() == [0.5, 0.5]


def test_scaler_step_and_overflow_skips() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    weight, optimizer = _setup(scaler)
    scaler.scale(weight.sum()).backward()
    optimizer.step()
    assert not optimizer.step_was_skipped
    assert weight.tolist() == [0.5, 0.5]  # unscaled gradient of 1
    optimizer.zero_grad()
    scaler.scale(weight.sum() * float("inf")).backward()
    optimizer.step()
    assert optimizer.step_was_skipped
    assert weight.tolist() == [0.5, 0.5]
    assert scaler.get_scale() == 2.0  # backed off


def test_skip_detection_without_step_hooks() -> None:
    class Bare:
        """An optimizer-like object without torch's step hooks."""

        def __init__(self, params: list[torch.Tensor]) -> None:
            self.inner = torch.optim.SGD(params, lr=1.0)
            self.param_groups = self.inner.param_groups
            self.state: dict[str, object] = {}

        def step(self, closure: object = None) -> None:
            self.inner.step()

        def zero_grad(self) -> None:
            self.inner.zero_grad()

    weight = torch.nn.Parameter(torch.ones(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    optimizer = AcceleratedOptimizer(Bare([weight]), scaler=scaler)  # type: ignore[arg-type]
    scaler.scale(weight.sum() * float("nan")).backward()
    optimizer.step()
    assert optimizer.step_was_skipped
    optimizer.zero_grad()
    with pytest.raises(
        ValueError, match=r"zero_grad\(set_to_none=False\) is not supported by Bare.zero_grad"
    ):
        optimizer.zero_grad(set_to_none=False)


def test_passthroughs_and_state_dict() -> None:
    weight, optimizer = _setup()
    assert optimizer.param_groups[0]["lr"] == 0.5
    optimizer.param_groups[0]["lr"] = 0.25
    assert optimizer.optimizer.param_groups[0]["lr"] == 0.25
    assert optimizer.defaults["lr"] == 0.5
    state = optimizer.state_dict()
    other_weight, other = _setup()
    other.load_state_dict(state)
    assert other.param_groups[0]["lr"] == 0.25
    extra = torch.nn.Parameter(torch.zeros(1))
    optimizer.add_param_group({"params": [extra]})
    assert len(optimizer.optimizer.param_groups) == 2


def test_works_with_a_torch_lr_scheduler_and_pickles() -> None:
    scaler = torch.amp.GradScaler("cpu")
    weight, optimizer = _setup(scaler)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler.scale(weight.sum()).backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.25
    clone = pickle.loads(pickle.dumps(optimizer))
    assert isinstance(clone, AcceleratedOptimizer)
    assert clone.scaler is not None
    clone.optimizer.zero_grad()
    clone.scaler.scale(clone.param_groups[0]["params"][0].sum() * float("inf")).backward()
    clone.step()
    assert clone.step_was_skipped  # the step hook is re-registered after unpickling


def test_device_placement_moves_existing_state() -> None:
    weight = torch.nn.Parameter(torch.ones(2))
    inner = torch.optim.Adam([weight])
    weight.sum().backward()
    inner.step()
    optimizer = AcceleratedOptimizer(inner, device_placement=True)
    assert optimizer.state[weight]["exp_avg"].device.type == "cpu"
    nested = move_to_device({"a": [torch.ones(1), (torch.zeros(1), 3)]}, "meta")
    assert nested["a"][0].device.type == "meta" and nested["a"][1][1] == 3


def test_train_and_eval_reach_schedule_free_optimizers() -> None:
    calls: list[str] = []

    class ScheduleFree(torch.optim.SGD):
        def train(self) -> None:
            calls.append("train")

        def eval(self) -> None:
            calls.append("eval")

    optimizer = AcceleratedOptimizer(ScheduleFree([torch.nn.Parameter(torch.ones(1))], lr=1.0))
    optimizer.train()
    optimizer.eval()
    assert calls == ["train", "eval"]


def test_patch_optimizer_step_marks_the_step_taken() -> None:
    from hasten.optimizer import AcceleratedOptimizer, patch_optimizer_step

    model = torch.nn.Linear(2, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = AcceleratedOptimizer(inner, device_placement=False)
    wrapped._stepped = False
    calls: list[int] = []

    def step(*args: object, **kwargs: object) -> str:
        calls.append(1)
        return "stepped"

    patched = patch_optimizer_step(wrapped, step)
    assert patched() == "stepped" and calls == [1]
    assert wrapped._stepped is True
    assert patched.__name__ == "step"

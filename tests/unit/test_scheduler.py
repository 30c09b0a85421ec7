"""AcceleratedScheduler: follows real optimizer steps, num_processes steps unless split_batches."""

from __future__ import annotations

import pickle

import pytest
import torch

from hasten.optimizer import AcceleratedOptimizer
from hasten.scheduler import AcceleratedScheduler
from hasten.state import GradientState

# Some tests step the schedule without an optimizer step on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")


def _setup(
    **kwargs: object,
) -> tuple[AcceleratedOptimizer, torch.optim.lr_scheduler.StepLR, torch.nn.Parameter]:
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = AcceleratedOptimizer(torch.optim.SGD([weight], lr=1.0), **kwargs)  # type: ignore[arg-type]
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5), weight


def test_steps_after_a_real_optimizer_step() -> None:
    optimizer, inner, weight = _setup()
    scheduler = AcceleratedScheduler(inner, optimizer)
    weight.sum().backward()
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr() == [0.5]
    assert scheduler.last_epoch == 1  # other attributes read through


def test_no_step_when_the_optimizer_step_was_skipped() -> None:
    scaler = torch.amp.GradScaler("cpu")
    optimizer, inner, weight = _setup(scaler=scaler)
    scheduler = AcceleratedScheduler(inner, [optimizer])
    scaler.scale(weight.sum() * float("inf")).backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.step_was_skipped
    assert scheduler.get_last_lr() == [1.0]


def test_accumulation_steps_do_not_advance_the_schedule() -> None:
    from hasten.config.project import GradientAccumulationPlugin

    optimizer, inner, _ = _setup()
    state = GradientState(GradientAccumulationPlugin(num_steps=2, adjust_scheduler=False))
    scheduler = AcceleratedScheduler(inner, optimizer)
    state._set_sync_gradients(False)
    scheduler.step()
    assert scheduler.get_last_lr() == [1.0]
    assert inner._step_count == 1


def test_adjust_scheduler_counts_accumulation_steps() -> None:
    from hasten.config.project import GradientAccumulationPlugin

    optimizer, inner, _ = _setup()
    state = GradientState(GradientAccumulationPlugin(num_steps=2, adjust_scheduler=True))
    scheduler = AcceleratedScheduler(inner, optimizer)
    state._set_sync_gradients(False)
    scheduler.step()
    assert inner._step_count == 2
    assert scheduler.get_last_lr() == [1.0]


def test_one_step_per_process_unless_split_batches() -> None:
    optimizer, inner, _ = _setup()
    scheduler = AcceleratedScheduler(inner, optimizer)
    scheduler._num_processes = 3
    scheduler.split_batches = False  # recomputes the steps per call
    scheduler.step()
    assert scheduler.get_last_lr() == [0.125]
    scheduler.split_batches = True
    scheduler.step()
    assert scheduler.get_last_lr() == [0.0625]


def test_bounded_schedules_stop_at_their_end() -> None:
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = AcceleratedOptimizer(torch.optim.SGD([weight], lr=1.0))
    inner = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=4)
    scheduler = AcceleratedScheduler(inner, optimizer)
    scheduler._num_processes = 3
    scheduler.split_batches = False
    for _ in range(3):
        scheduler.step()  # would raise past total_steps without the bound
    assert inner._step_count == 5


def test_adjust_scheduler_bumps_do_not_end_a_bounded_schedule_early() -> None:
    # 3 optimizer steps of 4 micro-steps each on OneCycleLR(total_steps=3): adjust_scheduler
    # advances _step_count on the 9 non-sync micro-steps, yet all 3 real steps are taken.
    from hasten.config.project import GradientAccumulationPlugin

    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = AcceleratedOptimizer(torch.optim.SGD([weight], lr=1.0))
    inner = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=3)
    state = GradientState(GradientAccumulationPlugin(num_steps=4, adjust_scheduler=True))
    scheduler = AcceleratedScheduler(inner, optimizer)
    for micro_step in range(1, 13):
        state._set_sync_gradients(micro_step % 4 == 0)
        scheduler.step()
    assert inner.last_epoch == 3
    assert inner._step_count == 13  # 1 + 9 bumps + 3 steps


def test_without_step_with_optimizer_always_steps() -> None:
    optimizer, inner, _ = _setup()
    scheduler = AcceleratedScheduler(inner, optimizer, step_with_optimizer=False)
    GradientState()._set_sync_gradients(False)
    scheduler.step()
    assert scheduler.get_last_lr() == [0.5]
    assert not scheduler.step_with_optimizer


def test_state_dict_and_pickle() -> None:
    optimizer, inner, _ = _setup()
    scheduler = AcceleratedScheduler(inner, optimizer)
    scheduler.step()
    state = scheduler.state_dict()
    other_opt, other_inner, _ = _setup()
    other_opt.load_state_dict(optimizer.state_dict())
    other = AcceleratedScheduler(other_inner, other_opt)
    other.load_state_dict(state)
    assert other.get_last_lr() == [0.5]
    clone = pickle.loads(pickle.dumps(other))
    assert clone.get_last_lr() == [0.5]
    clone.step()
    assert clone.get_last_lr() == [0.25]

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

from hasten.training.accumulation import GradientAccumulator


class FakeGradientState:
    def __init__(self, num_steps: int, sync_each_batch: bool = False) -> None:
        self.num_steps = num_steps
        self.sync_with_dataloader = True
        self.end_of_dataloader = False
        self.plugin_kwargs: dict[str, Any] = {"sync_each_batch": sync_each_batch}
        self.sync_gradients = True

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients


class CountingStrategy:
    def __init__(self, syncs_gradients: bool) -> None:
        self.syncs_gradients = syncs_gradients
        self.entered: list[nn.Module] = []
        self.exited = 0

    @contextlib.contextmanager
    def no_sync(self, module: nn.Module) -> Iterator[None]:
        self.entered.append(module)
        try:
            yield
        finally:
            self.exited += 1


def run(acc: GradientAccumulator, state: FakeGradientState, n: int, model: nn.Module) -> list[bool]:
    flags = []
    for i in range(n):
        state.end_of_dataloader = i == n - 1
        with acc.accumulate([model]):
            flags.append(state.sync_gradients)
    return flags


def test_syncs_every_num_steps_and_on_last_batch() -> None:
    state = FakeGradientState(num_steps=4)
    strategy = CountingStrategy(syncs_gradients=True)
    acc = GradientAccumulator(state, strategy)
    model = nn.Linear(1, 1)
    flags = run(acc, state, 6, model)
    assert flags == [False, False, False, True, False, True]
    # no_sync entered exactly on the non-sync micro-steps, and always exited.
    assert len(strategy.entered) == 4
    assert strategy.exited == 4
    assert acc.step == 0  # the last batch restarts the cycle


def test_sync_with_dataloader_off_keeps_counting() -> None:
    state = FakeGradientState(num_steps=4)
    state.sync_with_dataloader = False
    acc = GradientAccumulator(state, CountingStrategy(syncs_gradients=False))
    assert run(acc, state, 6, nn.Linear(1, 1)) == [False, False, False, True, False, False]


def test_single_process_never_enters_no_sync() -> None:
    state = FakeGradientState(num_steps=2)
    strategy = CountingStrategy(syncs_gradients=False)
    acc = GradientAccumulator(state, strategy)
    assert run(acc, state, 3, nn.Linear(1, 1)) == [False, True, True]
    assert strategy.entered == []


def test_sync_each_batch_communicates_every_step() -> None:
    state = FakeGradientState(num_steps=3, sync_each_batch=True)
    strategy = CountingStrategy(syncs_gradients=True)
    acc = GradientAccumulator(state, strategy)
    assert run(acc, state, 3, nn.Linear(1, 1)) == [False, False, True]
    assert strategy.entered == []


def test_exception_inside_still_exits_no_sync() -> None:
    state = FakeGradientState(num_steps=2)
    strategy = CountingStrategy(syncs_gradients=True)
    acc = GradientAccumulator(state, strategy)
    with contextlib.suppress(KeyError), acc.accumulate([nn.Linear(1, 1)]):
        raise KeyError("boom")
    assert strategy.exited == 1

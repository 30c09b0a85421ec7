"""LocalSGD in one process: a counter that never communicates; bad settings raise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hasten import Accelerator
from hasten.local_sgd import LocalSGD
from hasten.strategies import UnwiredStrategy


def test_single_process_is_disabled_and_leaves_parameters_alone() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(nn.Linear(2, 2))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(acc, model, local_sgd_steps=1) as local_sgd:
        assert not local_sgd.enabled
        for _ in range(3):
            local_sgd.step()
    assert local_sgd.num_steps == 3
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)


def test_enabled_false_is_a_no_op() -> None:
    acc = Accelerator(cpu=True)
    local_sgd = LocalSGD(acc, nn.Linear(2, 2), local_sgd_steps=2, enabled=False)
    with local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "4"])
def test_bad_local_sgd_steps(steps: object) -> None:
    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="local_sgd_steps must be"):
        LocalSGD(acc, nn.Linear(2, 2), local_sgd_steps=steps)  # type: ignore[arg-type]


def test_sharding_strategies_are_refused_with_the_reason() -> None:
    fake = SimpleNamespace(strategy=UnwiredStrategy("FSDP"))
    with pytest.raises(ValueError, match="single-process and DDP"):
        LocalSGD(fake, nn.Linear(2, 2), local_sgd_steps=2)  # type: ignore[arg-type]

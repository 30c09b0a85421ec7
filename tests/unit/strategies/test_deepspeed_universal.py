"""The refusals of a ZeRO load on another number of processes, on stand-in engines (no group)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hasten.strategies.deepspeed.strategy import DeepSpeedStrategy
from hasten.strategies.deepspeed.universal import check_adam_state, check_one_zero3_group


def _engine(optimizer: torch.optim.Optimizer, stage: int = 2, nvme: bool = False) -> Any:
    return SimpleNamespace(
        optimizer=SimpleNamespace(optimizer=optimizer),
        seq_dp_world_size=1,
        zero_optimization=lambda: stage > 0,
        zero_optimization_stage=lambda: stage,
        zero_nvme_offload_optimizer=lambda: nvme,
    )


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, 2))]


def test_adam_and_adamw_are_carried_by_the_universal_checkpoint() -> None:
    check_adam_state(_engine(torch.optim.AdamW(_params())), saved=2)
    check_adam_state(_engine(torch.optim.Adam(_params())), saved=2)


@pytest.mark.parametrize(
    ("optimizer", "named"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "the state of SGD would be lost"),
        (lambda p: torch.optim.AdamW(p, amsgrad=True), "AdamW with amsgrad=True would be lost"),
    ],
)
def test_other_optimizer_states_are_refused(optimizer: Any, named: str) -> None:
    with pytest.raises(ValueError, match="saved by 2 process") as refused:
        check_adam_state(_engine(optimizer(_params())), saved=2)
    assert named in str(refused.value)
    assert "Load it on 2 process(es), or train with torch.optim.Adam/AdamW" in str(refused.value)


def test_zero3_with_two_parameter_groups_is_refused() -> None:
    a, b = _params()
    two = torch.optim.AdamW([{"params": [a]}, {"params": [b], "lr": 1e-4}])
    check_one_zero3_group(_engine(two, stage=2), saved=2)  # stages 1-2 restore every group
    check_one_zero3_group(_engine(torch.optim.AdamW([a, b]), stage=3), saved=2)
    with pytest.raises(ValueError, match="this one has 2") as refused:
        check_one_zero3_group(_engine(two, stage=3), saved=2)
    assert "use one parameter group, or use ZeRO stage 1 or 2" in str(refused.value)


def test_nvme_offloaded_optimizer_state_is_refused_on_another_number_of_processes() -> None:
    strategy = SimpleNamespace(engines=[_engine(torch.optim.AdamW(_params()), nvme=True)])
    reason = DeepSpeedStrategy.refuses_process_count(strategy, 2, 1)  # type: ignore[arg-type]
    assert reason is not None
    assert "offloaded to NVMe" in reason
    assert 'offload the optimizer to the CPU (offload_optimizer: {"device": "cpu"})' in reason
    cpu = SimpleNamespace(engines=[_engine(torch.optim.AdamW(_params()))])
    assert DeepSpeedStrategy.refuses_process_count(cpu, 2, 1) is None  # type: ignore[arg-type]

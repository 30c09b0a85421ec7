from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.training.prepare import (
    PreparedRegistry,
    check_optimizer_device,
    make_backward,
    same_device,
)


def test_registry_refuses_a_second_claim_and_hands_back_what_it_returned() -> None:
    reg = PreparedRegistry()
    model = nn.Linear(1, 1)
    reg.claim(model, "model")
    with pytest.raises(RuntimeError, match=r"This model \(Linear\) was already passed"):
        reg.claim(model, "model")
    wrapper = nn.Sequential(model)
    reg.record(wrapper)
    assert wrapper in reg and reg.hands_back(wrapper)
    assert not reg.hands_back(nn.Linear(1, 1))
    marked = nn.Linear(1, 1)
    marked._is_accelerate_prepared = True  # prepared by another Accelerator
    assert reg.hands_back(marked)
    unhashable_but_referenceable = 3  # ints cannot be weakly referenced: identity fallback
    reg.claim(unhashable_but_referenceable, "object")
    assert unhashable_but_referenceable in reg
    reg.forget()
    assert model not in reg and wrapper not in reg


def test_registry_evaluation_only_models_are_claimed_again_for_training() -> None:
    reg = PreparedRegistry()
    model = nn.Linear(1, 1)
    reg.claim(model, "model")
    reg.record(model, evaluation_only=True)
    assert reg.hands_back(model, training=False)
    assert not reg.hands_back(model, training=True)
    reg.forget()
    assert not reg.hands_back(model, training=True)  # remembered across forget()
    reg.claim(model, "model")  # no error: evaluation -> training
    reg.record(model)
    assert reg.hands_back(model, training=True)


def test_same_device() -> None:
    cpu = torch.device("cpu")
    assert same_device(cpu, cpu)
    assert not same_device(torch.device("meta"), cpu)
    assert same_device(torch.device("cuda", 0), torch.device("cuda"))
    assert not same_device(torch.device("cuda", 1), torch.device("cuda", 0))


def test_check_optimizer_device() -> None:
    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    check_optimizer_device(opt, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="prepared without its model"):
        check_optimizer_device(opt, torch.device("meta"))


@pytest.mark.parametrize(
    ("steps", "scaled", "factor"), [(1, False, 1), (4, False, 0.25), (1, True, 8), (2, True, 4)]
)
def test_make_backward(steps: int, scaled: bool, factor: float) -> None:
    w = nn.Parameter(torch.ones(()))
    backward = make_backward(steps, (lambda t: t * 8) if scaled else None)
    backward(w * 3)
    assert float(w.grad) == pytest.approx(3 * factor)
    w.grad = None
    backward(w * 3, retain_graph=False)
    assert float(w.grad) == pytest.approx(3 * factor)

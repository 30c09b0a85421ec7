"""LocalSGD on 2 forked CPU processes: replicas drift between syncs, agree after each one."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed

STEPS = 7
EVERY = 3


def _flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def _train() -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.local_sgd import LocalSGD

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    gen = torch.Generator().manual_seed(100 + acc.process_index)  # different data per rank
    before_step: list[list[float]] = []
    after_step: list[list[float]] = []
    grads: list[list[float]] = []
    with LocalSGD(acc, model, local_sgd_steps=EVERY) as local_sgd:
        assert local_sgd.enabled
        for _ in range(STEPS):
            x = torch.randn(8, 3, generator=gen)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            acc.backward(loss)
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist())
            optimizer.step()
            optimizer.zero_grad()
            before_step.append(_flat(model))
            local_sgd.step()
            after_step.append(_flat(model))
    return {"before": before_step, "after": after_step, "grads": grads, "exit": _flat(model)}


@pytest.mark.timeout(60)
def test_replicas_agree_after_each_sync_and_differ_between() -> None:
    r0, r1 = run_distributed(_train, world_size=2, timeout=60)
    for step in range(STEPS):
        a0, a1 = torch.tensor(r0["after"][step]), torch.tensor(r1["after"][step])
        # no gradient all-reduce inside LocalSGD: each rank keeps its own gradient
        assert not torch.allclose(torch.tensor(r0["grads"][step]), torch.tensor(r1["grads"][step]))
        if (step + 1) % EVERY == 0:
            torch.testing.assert_close(a0, a1)
            mean = (torch.tensor(r0["before"][step]) + torch.tensor(r1["before"][step])) / 2
            torch.testing.assert_close(a0, mean)  # the sync is the mean of the replicas
        else:
            assert not torch.allclose(a0, a1), f"replicas agree at local step {step + 1}"
            assert r0["after"][step] == r0["before"][step]  # no sync: step() left them alone
    # leaving the context averages the last local steps too
    torch.testing.assert_close(torch.tensor(r0["exit"]), torch.tensor(r1["exit"]))
    assert not torch.allclose(torch.tensor(r0["after"][-1]), torch.tensor(r1["after"][-1]))

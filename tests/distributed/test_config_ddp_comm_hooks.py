"""DistributedDataParallelKwargs.register_comm_hook on a real 2-process gloo DDP model.

All hook variants run in one pair of workers (one process group) to keep the test fast.
"""

from __future__ import annotations

from typing import Any

import pytest

from _support.distributed import run_distributed
from hasten.config.kwargs import DistributedDataParallelKwargs

pytestmark = [pytest.mark.distributed]

WORKING = {
    "fp16": {"comm_hook": "fp16"},
    "power_sgd": {"comm_hook": "power_sgd", "comm_state_option": {"start_powerSGD_iter": 2}},
    # torch 2.13's batched_powerSGD_hook crashes once compression starts (it hands a 2-D matrix
    # to _orthogonalize, which asserts 3-D), so only its warm-up (plain all-reduce) phase runs.
    "batched_power_sgd": {
        "comm_hook": "batched_power_sgd",
        "comm_state_option": {"start_powerSGD_iter": 1000},
    },
    "power_sgd+fp16": {
        "comm_hook": "power_sgd",
        "comm_wrapper": "fp16",
        "comm_state_option": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
    },
}
BF16 = {
    "bf16": {"comm_hook": "bf16"},
    "power_sgd+bf16": {"comm_hook": "power_sgd", "comm_wrapper": "bf16"},
}


def _bf16_supported() -> bool:
    import torch
    import torch.distributed as dist

    cuda_build = torch.version.cuda is not None or torch.version.hip is not None
    return bool(cuda_build and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10))


def _train(options: dict[str, Any]) -> list[list[float]]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 16, bias=False))
    DistributedDataParallelKwargs(**options).register_comm_hook(model)
    for _ in range(3):
        # Different data on each rank: without a working all-reduce the gradients would differ.
        inputs = torch.full((8, 16), float(rank + 1)) * torch.arange(1, 17.0)
        model.zero_grad()
        model(inputs).sum().backward()
    grad = model.module.weight.grad
    assert grad is not None
    return grad.tolist()


def _bf16_error(options: dict[str, Any]) -> str:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(2, 2))
    try:
        DistributedDataParallelKwargs(**options).register_comm_hook(model)
    except RuntimeError as err:
        return str(err)
    return "registered"


def _run_all() -> dict[str, Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    results: dict[str, Any] = {name: _train(opts) for name, opts in WORKING.items()}
    results.update({name: _bf16_error(opts) for name, opts in BF16.items()})
    return results


@pytest.fixture(scope="module")
def per_rank() -> list[dict[str, Any]]:
    return run_distributed(_run_all, world_size=2, timeout=90)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(WORKING))
def test_hook_keeps_ranks_in_sync_and_averages(per_rank: list[dict[str, Any]], name: str) -> None:
    grads = [results[name] for results in per_rank]
    assert grads[0] == grads[1]
    # Mean of rank 0 (inputs x1) and rank 1 (x2): every row is 8 samples * 1.5 * [1..16]. The
    # gradient has rank 1, so even a rank-1 PowerSGD approximation reproduces it.
    expected = [8 * 1.5 * c for c in range(1, 17)]
    for row in grads[0]:
        assert row == pytest.approx(expected, rel=2e-2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(BF16))
def test_bf16_hooks_explain_when_torch_cannot_run_them(
    per_rank: list[dict[str, Any]], name: str
) -> None:
    if _bf16_supported():
        pytest.skip("this torch build supports bf16 all-reduce hooks")
    for results in per_rank:
        assert "needs bf16 all-reduce" in results[name]
        assert "comm_hook='fp16'" in results[name]

"""2-process tensor parallelism: hasten's TP step vs a hand-written ``parallelize_module`` loop.

Run under torchrun (the script relaunches itself that way when started plainly):
``python benchmarks/bench_tp.py [--steps N] [--rounds R] [--width W] [--depth D]``. Both loops
shard the same MLP-block model from the same plan (up colwise, down rowwise) on a 1-D ``tp``
mesh over gloo; a second raw loop is the noise floor. Rounds alternate the loops and rank 0
prints median/best time per step and the ratios to the raw loop (<= 1.05 is the target).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _harness import relaunch_under_torchrun, report, timed
from _models import BlockModel
from torch import nn

BATCH = 16


def make_model(width: int, depth: int) -> BlockModel:
    torch.manual_seed(0)
    return BlockModel(width, depth)


def _loop(
    model: nn.Module, opt: torch.optim.Optimizer, backward: Callable[[torch.Tensor], None]
) -> Callable[[list[Any]], None]:
    def run(batches: list[Any]) -> None:
        for x, y in batches:
            backward(F.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()

    return run


def raw_tp(width: int, depth: int) -> Callable[[list[Any]], None]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    model = make_model(width, depth)
    plan: dict[str, Any] = {}
    for i in range(depth):
        plan[f"layers.{i}.up"] = ColwiseParallel()
        plan[f"layers.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _loop(model, opt, lambda loss: loss.backward())


def hasten_tp(accelerator: Any, width: int, depth: int) -> Callable[[list[Any]], None]:
    net = make_model(width, depth)
    model, opt = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-4))
    return _loop(model, opt, accelerator.backward)


def worker(steps: int, rounds: int, width: int, depth: int) -> None:
    torch.set_num_threads(1)
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig

    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    loops = {
        "hasten": hasten_tp(accelerator, width, depth),
        "raw parallelize": raw_tp(width, depth),
        "raw control": raw_tp(width, depth),  # its ratio to "raw parallelize" is the noise
    }
    g = torch.Generator().manual_seed(0)  # a tensor-parallel group reads the same batches
    batches = [
        (torch.randn(BATCH, width, generator=g), torch.randn(BATCH, width, generator=g))
        for _ in range(steps)
    ]
    for run in loops.values():
        run(batches[:5])
    times = timed(rounds, {name: (lambda run=run: run(batches)) for name, run in loops.items()})
    per_step = {name: [t / steps for t in ts] for name, ts in times.items()}
    title = f"2-process TP step, {depth} blocks of width {width}, batch {BATCH}, gloo"
    report(title, per_step, "raw parallelize", 1e6, "us/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    relaunch_under_torchrun(__file__)
    worker(args.steps, args.rounds, args.width, args.depth)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

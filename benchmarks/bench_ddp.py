"""2-process DDP step time: hasten vs a hand-written DDP loop (and HF Accelerate if installed).

Run under torchrun (the script relaunches itself that way when started plainly):
``python benchmarks/bench_ddp.py [--steps N] [--rounds R] [--width W]``. Every worker builds
the three loops in one process group (gloo, CPU), alternates them over several rounds, and rank
0 prints the median and best round's time per step and their ratios to the hand-written loop.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _reference import require_real_accelerate
from torch import nn

BATCH = 32


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))


def raw_ddp(width: int) -> Callable[[list[Any]], None]:
    model = nn.parallel.DistributedDataParallel(make_model(width))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def run(batches: list[Any]) -> None:
        for x, y in batches:
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    return run


def framework(accelerator: Any, width: int) -> Callable[[list[Any]], None]:
    net = make_model(width)
    model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=1e-3))

    def run(batches: list[Any]) -> None:
        for x, y in batches:
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()

    return run


def worker(steps: int, rounds: int, width: int) -> None:
    torch.set_num_threads(1)
    from hasten import Accelerator

    loops: dict[str, Callable[[list[Any]], None]] = {}
    loops["hasten"] = framework(Accelerator(cpu=True), width)  # sets up the gloo group
    loops["raw"] = raw_ddp(width)
    # A second, identical hand-written loop: its ratio to "raw" is the noise floor of the run.
    loops["raw_control"] = raw_ddp(width)
    try:
        require_real_accelerate()
        from accelerate import (
            Accelerator as HFAccelerator,  # optional: accelerate (comparison only)
        )

        loops["accelerate"] = framework(HFAccelerator(cpu=True), width)
    except ImportError:
        pass
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        (torch.randn(BATCH, width, generator=g), torch.randn(BATCH, width, generator=g))
        for _ in range(steps)
    ]
    for run in loops.values():
        run(batches[:20])
    times: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(rounds):
        # Rotate the order each round so no loop always runs right after another's traffic.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = loops[name]
            dist.barrier()
            start = time.perf_counter()
            run(batches)
            times[name].append((time.perf_counter() - start) / steps)
    if dist.get_rank() == 0:
        med = {name: statistics.median(ts) for name, ts in times.items()}
        best = {name: min(ts) for name, ts in times.items()}
        print(f"2-process DDP, MLP {width}-{width}-{width}, batch {BATCH}/process, gloo")
        for name in times:
            print(
                f"  {name:<11} median {med[name] * 1e6:8.1f} us/step (ratio {med[name] / med['raw']:.3f})"
                f"   best {best[name] * 1e6:8.1f} us/step (ratio {best[name] / best['raw']:.3f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        torchrun = shutil.which("torchrun") or os.path.join(
            os.path.dirname(sys.executable), "torchrun"
        )
        cmd = [torchrun, "--nproc_per_node", "2", "--standalone", __file__]
        cmd += [
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
            "--width",
            str(args.width),
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        raise SystemExit(subprocess.run(cmd, env=env, timeout=900, check=False).returncode)
    worker(args.steps, args.rounds, args.width)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Per-step overhead of hasten vs a hand-written PyTorch loop (and HF Accelerate if installed).

Workload: a 64-64-64 MLP, batch 32, SGD, single process on CPU, where framework overhead
dominates. Modes: fp32, gradient accumulation 4, bf16 autocast (raw loop uses torch.autocast),
and prepared-DataLoader iteration (batches/s vs the raw DataLoader). Each mode runs in its own
child process; inside it the implementations alternate over several rounds and the fastest
round per implementation is reported (the least disturbed by other load on a shared machine;
the median ratio is printed too). Usage: ``python benchmarks/bench_step.py [--steps N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _reference import require_real_accelerate
from torch import nn

MODES = ("fp32", "accum4", "bf16", "dataloader")
BATCH, WIDTH = 32, 64


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def make_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g))
        for _ in range(n)
    ]


def raw_loop(mode: str) -> Callable[[list[Any]], None]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    if mode == "fp32":

        def run(batches: list[Any]) -> None:
            for x, y in batches:
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()

    elif mode == "accum4":

        def run(batches: list[Any]) -> None:
            for i, (x, y) in enumerate(batches):
                loss = F.mse_loss(model(x), y) / 4
                loss.backward()
                if (i + 1) % 4 == 0:
                    opt.step()
                    opt.zero_grad()

    else:

        def run(batches: list[Any]) -> None:
            for x, y in batches:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
                loss = F.mse_loss(out.float(), y)
                loss.backward()
                opt.step()
                opt.zero_grad()

    return run


def framework_loop(mode: str, accelerator_cls: Any) -> Callable[[list[Any]], None]:
    kwargs: dict[str, Any] = {"cpu": True}
    if mode == "accum4":
        kwargs["gradient_accumulation_steps"] = 4
    if mode == "bf16":
        kwargs["mixed_precision"] = "bf16"
    acc = accelerator_cls(**kwargs)
    net = make_model()
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=1e-3))

    if mode == "accum4":

        def run(batches: list[Any]) -> None:
            for x, y in batches:
                with acc.accumulate(model):
                    loss = F.mse_loss(model(x), y)
                    acc.backward(loss)
                    opt.step()
                    opt.zero_grad()

    else:

        def run(batches: list[Any]) -> None:
            for x, y in batches:
                loss = F.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()

    return run


def dataloader_loops(
    accelerators: dict[str, Any], n: int
) -> dict[str, Callable[[list[Any]], None]]:
    data = torch.utils.data.TensorDataset(
        torch.randn(n * BATCH, WIDTH), torch.randn(n * BATCH, WIDTH)
    )
    loops: dict[str, Callable[[list[Any]], None]] = {}
    raw = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)

    def iterate(loader: Any) -> Callable[[list[Any]], None]:
        def run(_: list[Any]) -> None:
            for _batch in loader:
                pass

        return run

    loops["raw"] = iterate(raw)
    loops["raw_control"] = iterate(
        torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    )
    for name, cls in accelerators.items():
        acc = cls(cpu=True)
        loops[name] = iterate(
            acc.prepare(torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True))
        )
    return loops


def child(mode: str, steps: int, rounds: int) -> dict[str, float]:
    torch.set_num_threads(1)
    from hasten import Accelerator

    accelerators: dict[str, Any] = {"hasten": Accelerator}
    try:
        require_real_accelerate()
        from accelerate import (
            Accelerator as HFAccelerator,  # optional: accelerate (comparison only)
        )

        accelerators["accelerate"] = HFAccelerator
    except ImportError:
        pass
    if mode == "dataloader":
        loops = dataloader_loops(accelerators, steps)
    else:
        # raw_control is a second, identical raw loop: its ratio to raw is the noise floor.
        loops = {"raw": raw_loop(mode), "raw_control": raw_loop(mode)}
        for name, cls in accelerators.items():
            loops[name] = framework_loop(mode, cls)
    batches = make_batches(steps)
    for run in loops.values():  # warm-up: allocator, autograd graph caches
        run(batches[: max(8, steps // 10)])
    times: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(rounds):
        # Rotate the order each round so no implementation always follows the same one.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = loops[name]
            start = time.perf_counter()
            run(batches)
            times[name].append((time.perf_counter() - start) / steps)
    best = {name: min(ts) for name, ts in times.items()}
    best.update({f"{name}_median": statistics.median(ts) for name, ts in times.items()})
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--steps", type=int, default=48, help="steps per round (short rounds dodge load spikes)"
    )
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.rounds)))
        return
    print(
        f"{'mode':<11}{'raw us/step':>13}{'hasten':>10}{'accelerate':>12}{'hasten/raw':>12}"
        f"{'accel/raw':>11}{'hasten/raw (median)':>21}{'accel/raw (median)':>20}"
        f"{'control/raw':>13}"
    )
    for mode in args.modes.split(","):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--steps",
                str(args.steps),
                "--rounds",
                str(args.rounds),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        res = json.loads(out.stdout.strip().splitlines()[-1])
        raw = res["raw"]
        accel = res.get("accelerate")
        accel_ratio = f"{accel / raw:11.3f}" if accel else f"{'n/a':>11}"
        print(
            f"{mode:<11}{raw * 1e6:13.1f}{res['hasten'] * 1e6:10.1f}"
            f"{(accel or float('nan')) * 1e6:12.1f}{res['hasten'] / raw:12.3f}{accel_ratio}"
            f"{res['hasten_median'] / res['raw_median']:21.3f}"
            f"{res.get('accelerate_median', float('nan')) / res['raw_median']:20.3f}"
            f"{res['raw_control'] / raw:13.3f}"
        )
    print("(dataloader row: time per batch; ratio < 1 means faster than raw; control/raw: an")
    print(" identical raw loop, i.e. how far apart equal code lands on this machine right now)")


if __name__ == "__main__":
    main()

"""A resharded ZeRO ``load_state`` (saved on 2 processes, loaded on 1) vs a same-layout one.

``python benchmarks/bench_reshard.py [--stage S] [--width W] [--depth D] [--rounds R] [--dir D]``.
A 2-process torchrun saves a ZeRO-S checkpoint with ``save_state``; then one process saves its
own checkpoint of the same model and times, in rotated rounds, ``load_state`` of its own (the
engine reads its files) against ``load_state`` of the 2-process one (DeepSpeed's universal
conversion into a temporary folder, then the engine's universal load). Prints each one's median,
min and max, and the resharded/same-layout ratio of the medians (issue 30's target: <= 1.2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

__all__ = ["main"]


def _model(width: int, depth: int) -> nn.Module:
    """A block model (Linear-ReLU-Linear blocks) of the given width and depth."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width)]
    return nn.Sequential(*layers)


def _prepared(args: argparse.Namespace) -> tuple[object, nn.Module]:
    """An Accelerator with the model and AdamW prepared under ZeRO ``args.stage``, one step taken."""
    from hasten import Accelerator
    from hasten.utils import DeepSpeedPlugin

    model = _model(args.width, args.depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": args.stage},
            "steps_per_print": 10**9,
        }
    )
    accelerator = Accelerator(deepspeed_plugin=plugin)
    engine, optimizer = accelerator.prepare(model, optimizer)
    loss = engine(torch.randn(4, args.width)).square().mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return accelerator, engine


def _save(args: argparse.Namespace) -> None:
    """(Under torchrun) save the checkpoint at this number of processes."""
    accelerator, _ = _prepared(args)
    accelerator.save_state(args.folder)  # type: ignore[attr-defined]


def _load(args: argparse.Namespace) -> None:
    """(One process) time load_state of the same-layout and the 2-process checkpoints."""
    accelerator, _ = _prepared(args)
    same, resharded = Path(args.dir) / "by1", Path(args.dir) / "by2"
    accelerator.save_state(str(same))  # type: ignore[attr-defined]
    loads = {"same layout": same, "resharded 2->1": resharded}
    times: dict[str, list[float]] = {name: [] for name in loads}
    names = list(loads)
    for r in range(args.rounds + 1):
        for name in names[r % 2 :] + names[: r % 2]:
            start = time.perf_counter()
            accelerator.load_state(str(loads[name]))  # type: ignore[attr-defined]
            if r:  # the first round warms both paths up
                times[name].append(time.perf_counter() - start)
    print(
        f"ZeRO-{args.stage} load_state, width {args.width} depth {args.depth}, {args.rounds} rounds"
    )
    for name, values in times.items():
        print(
            f"  {name:<16} median {statistics.median(values) * 1e3:8.1f} ms"
            f"   min {min(values) * 1e3:8.1f} ms   max {max(values) * 1e3:8.1f} ms"
        )
    ratio = statistics.median(times["resharded 2->1"]) / statistics.median(times["same layout"])
    best = min(times["resharded 2->1"]) / min(times["same layout"])
    print(f"  ratio resharded/same layout: median {ratio:.2f}x, min {best:.2f}x")


def _torchrun(nproc: int, phase: str, argv: list[str]) -> None:
    """Run this script's ``phase`` under torchrun with ``nproc`` processes."""
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun), "--nproc_per_node", str(nproc), "--standalone", __file__, *argv]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([*command, "--phase", phase], env=env, timeout=900, check=False)
    if done.returncode:
        raise SystemExit(done.returncode)


def main() -> None:
    """Parse the arguments; run the saving launch, then the timed one."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "save":
        args.folder = str(Path(args.dir) / "by2")
        _save(args)
        return
    if args.phase == "load":
        _load(args)
        return
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-reshard-"))
    argv = [f"--stage={args.stage}", f"--width={args.width}", f"--depth={args.depth}"]
    argv += [f"--rounds={args.rounds}", f"--dir={root}"]
    try:
        _torchrun(2, "save", argv)
        _torchrun(1, "load", argv)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""2-process DeepSpeed ZeRO: hasten's step vs a hand-written ``deepspeed.initialize`` loop; save_state vs
the engine's own ``save_checkpoint``.

Run under torchrun (the script relaunches itself that way when started plainly):
``python benchmarks/bench_deepspeed.py [--stage S] [--steps N] [--rounds R] [--width W]``. All loops
train the same block model with the same ZeRO config and client AdamW in one gloo process group
(hasten, the raw engine, and a second raw engine whose ratio to the first is the noise floor);
rounds alternate them and rank 0 prints median/best time per step and the ratio. The checkpoint
part times ``save_state`` (engine files + hasten's checksums, fsync, manifest and atomic publish,
RNG and loader files) against ``engine.save_checkpoint`` of the same engine state (which does not
fsync), and prints the throughput ratio (>= 1.0: hasten is as fast).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

BATCH = 16


def make_model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width)]
    return nn.Sequential(*layers)


def ds_config(stage: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }


def raw_engine(stage: int, width: int, depth: int) -> tuple[Callable[[list[Any]], None], Any]:
    import deepspeed

    model = make_model(width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=opt, config=ds_config(stage), dist_init_required=False
    )

    def run(batches: list[Any]) -> None:
        for x, y in batches:
            loss = F.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()

    return run, engine


def hasten_engine(
    accelerator: Any, width: int, depth: int
) -> tuple[Callable[[list[Any]], None], Any]:
    model = make_model(width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)

    def run(batches: list[Any]) -> None:
        for x, y in batches:
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()

    return run, model


def _timed(rounds: int, loops: dict[str, Callable[[], None]]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            dist.barrier()
            start = time.perf_counter()
            loops[name]()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
    return times


def _report(title: str, times: dict[str, list[float]], base: str, unit: float, label: str) -> None:
    if dist.get_rank() != 0:
        return
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    print(title)
    for name in times:
        print(
            f"  {name:<22} median {med[name] * unit:9.1f} {label} (ratio {med[name] / med[base]:.3f})"
            f"   best {best[name] * unit:9.1f} {label} (ratio {best[name] / best[base]:.3f})"
        )


def _checkpoints(accelerator: Any, engine: Any, rounds: int, root: Path) -> None:
    def raw_save() -> None:
        engine.save_checkpoint(str(root / "raw"), tag="pytorch_model")

    def hasten_save() -> None:
        accelerator.save_state(str(root / "hasten"))

    saves = _timed(rounds, {"engine.save_checkpoint": raw_save, "save_state": hasten_save})
    numel = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.parameters())
    _report(
        f"save ({numel * 16 / 2**20:.0f} MiB of fp32 weights, master copy and Adam moments)",
        saves,
        "engine.save_checkpoint",
        1e3,
        "ms",
    )


def worker(stage: int, steps: int, rounds: int, width: int, depth: int) -> None:
    torch.set_num_threads(1)
    from hasten import Accelerator
    from hasten.config.deepspeed import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config=ds_config(stage))
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin)
    hasten_run, model = hasten_engine(accelerator, width, depth)
    raw_run, _ = raw_engine(stage, width, depth)
    control_run, _ = raw_engine(stage, width, depth)
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        (torch.randn(BATCH, width, generator=g), torch.randn(BATCH, width, generator=g))
        for _ in range(steps)
    ]
    loops = {"hasten": hasten_run, "raw deepspeed": raw_run, "raw control": control_run}
    for run in loops.values():
        run(batches[:3])
    times = _timed(rounds, {name: (lambda run=run: run(batches)) for name, run in loops.items()})
    per_step = {name: [t / steps for t in ts] for name, ts in times.items()}
    _report(
        f"2-process ZeRO-{stage} step, {depth} blocks of width {width}, batch {BATCH}/process, gloo",
        per_step,
        "raw deepspeed",
        1e6,
        "us/step",
    )
    root = Path(tempfile.gettempdir()) / "hasten_bench_deepspeed"
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    dist.barrier()
    _checkpoints(accelerator, model, rounds, root)
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        torchrun = shutil.which("torchrun") or os.path.join(
            os.path.dirname(sys.executable), "torchrun"
        )
        cmd = [torchrun, "--nproc_per_node", "2", "--standalone", __file__]
        for name in ("stage", "steps", "rounds", "width", "depth"):
            cmd += [f"--{name}", str(getattr(args, name))]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        raise SystemExit(subprocess.run(cmd, env=env, timeout=900, check=False).returncode)
    worker(args.stage, args.steps, args.rounds, args.width, args.depth)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

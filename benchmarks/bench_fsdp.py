"""2-process FSDP2: hasten's step vs a hand-written ``fully_shard`` loop; sharded save/load vs raw DCP.

Run under torchrun (the script relaunches itself that way when started plainly):
``python benchmarks/bench_fsdp.py [--steps N] [--rounds R] [--width W] [--depth D]``. Both
loops shard the same block model (each block its own group, then the root) in one gloo process
group; rounds alternate them and rank 0 prints median/best time per step and the ratio. The
checkpoint part times ``save_state``/``load_state`` (staging, manifest with block checksums,
atomic publish, RNG and loader files included) against ``dcp.save``/``dcp.load`` of the same
model and optimizer state dicts, and prints time ratios (<= 1.0: hasten is as fast), with a second
raw loop as the noise floor. The async part times how long ``save_state(async_save=True)``
blocks the loop (the call, plus what the next optimizer step waits for the state copy) as a
share of a synchronous ``save_state`` (target <= 0.15).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _harness import record_snapshot_holds, relaunch_under_torchrun, report, timed
from _models import BlockModel

BATCH = 16


def make_model(width: int, depth: int) -> BlockModel:
    torch.manual_seed(0)
    return BlockModel(width, depth)


def raw_fsdp(width: int, depth: int) -> tuple[Callable[[list[Any]], None], Any, Any]:
    from torch.distributed.fsdp import fully_shard

    model = make_model(width, depth)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run(batches: list[Any]) -> None:
        for x, y in batches:
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    return run, model, opt


def hasten_fsdp(
    accelerator: Any, width: int, depth: int
) -> tuple[Callable[[list[Any]], None], Any, Any]:
    net = make_model(width, depth)
    model, opt = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-4))

    def run(batches: list[Any]) -> None:
        for x, y in batches:
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()

    return run, model, opt


def _checkpoints(accelerator: Any, model: Any, opt: Any, rounds: int, root: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def raw_save(folder: str) -> Callable[[], None]:
        def run() -> None:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=root / folder)

        return run

    def raw_load(folder: str) -> Callable[[], None]:
        def run() -> None:
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=root / folder)
            set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)

        return run

    def hasten_save() -> None:  # replaces the previous one (published atomically, old removed)
        accelerator.save_state(str(root / "hasten"))

    def hasten_load() -> None:
        accelerator.load_state(str(root / "hasten"))

    size = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # + Adam moments
    # "raw control" is a second copy of the raw loop: its ratio to the first is the noise floor
    saves = timed(
        rounds,
        {
            "raw dcp.save": raw_save("raw"),
            "save_state": hasten_save,
            "raw control": raw_save("ctl"),
        },
    )
    report(
        f"sharded save ({size / 2**20:.0f} MiB model+optimizer)", saves, "raw dcp.save", 1e3, "ms"
    )
    loads = timed(
        rounds,
        {
            "raw dcp.load": raw_load("raw"),
            "load_state": hasten_load,
            "raw control": raw_load("ctl"),
        },
    )
    report("sharded load", loads, "raw dcp.load", 1e3, "ms")


def _async_blocking(
    accelerator: Any, run: Callable[[list[Any]], None], batch: Any, rounds: int, root: Path
) -> None:
    """How long save_state(async_save=True) blocks the loop, beside a synchronous save_state.

    Blocked = the call + what the next optimizer step waits for the optimizer state's copy
    (taken on the writer thread, see hasten.checkpointing.storage.writer.Snapshot). The step after each
    save is timed too (a background write shares the cores). Round 0 makes the writer's
    process group and host buffers and is left out.
    """
    held, restore = record_snapshot_holds()
    times: dict[str, list[float]] = {
        "sync save_state": [], "async blocks": [], "async call": [], "held in step": [],
        "step after sync": [], "step after async": [],
    }  # fmt: skip
    for r in range(rounds + 1):
        for kind in ("sync", "async") if r % 2 else ("async", "sync"):
            held.clear()
            dist.barrier()
            start = time.perf_counter()
            accelerator.save_state(str(root / kind), async_save=kind == "async")
            called = time.perf_counter()
            run([batch])
            stepped = time.perf_counter()
            accelerator._checkpoints.wait()  # the background write ends before the next round
            if r == 0:
                continue
            if kind == "sync":
                times["sync save_state"].append(called - start)
            else:
                times["async call"].append(called - start)
                times["held in step"].append(sum(held))
                times["async blocks"].append(called - start + sum(held))
            times[f"step after {kind}"].append(
                stepped - called - (sum(held) if kind == "async" else 0)
            )
    restore()
    report("async sharded save: time the training loop is blocked", times, "sync save_state")


def worker(steps: int, rounds: int, width: int, depth: int) -> None:
    torch.set_num_threads(1)
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap"
    )
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    hasten_run, model, opt = hasten_fsdp(accelerator, width, depth)
    raw_run, _, _ = raw_fsdp(width, depth)
    control_run, _, _ = raw_fsdp(width, depth)  # its ratio to "raw" is the noise floor
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        (torch.randn(BATCH, width, generator=g), torch.randn(BATCH, width, generator=g))
        for _ in range(steps)
    ]
    loops = {"hasten": hasten_run, "raw fully_shard": raw_run, "raw control": control_run}
    for run in loops.values():
        run(batches[:5])
    times = timed(rounds, {name: (lambda run=run: run(batches)) for name, run in loops.items()})
    per_step = {name: [t / steps for t in ts] for name, ts in times.items()}
    report(
        f"2-process FSDP2 step, {depth} blocks of width {width}, batch {BATCH}/process, gloo",
        per_step,
        "raw fully_shard",
        1e6,
        "us/step",
    )
    root = Path(tempfile.gettempdir()) / "hasten_bench_fsdp"
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    dist.barrier()
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")  # raw overwrites
    _checkpoints(accelerator, model, opt, rounds, root)
    _async_blocking(accelerator, hasten_run, batches[0], rounds, root)
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)


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

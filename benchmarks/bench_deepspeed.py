"""2-process DeepSpeed ZeRO: hasten's step vs a hand-written ``deepspeed.initialize`` loop;
save_state/load_state vs the engine's own ``save_checkpoint``/``load_checkpoint``.

``python benchmarks/bench_deepspeed.py [--stage S] [--steps N] [--rounds R] [--width W]
[--save-rounds R] [--load-rounds R] [--dir D] [--burn N]`` (relaunches itself under torchrun; ``--burn N`` runs N
busy processes beside, to measure under load). All loops train the same block model with the
same ZeRO config and client AdamW in one gloo process group: hasten, the raw engine, and a second
raw engine whose ratio to the first is the noise floor. Rounds rotate the loops; rank 0 prints
median/best time per step and the ratios. The checkpoint part times ``save_state`` (engine files
with hasten's checksums, fsync, RNG files, manifest and atomic publish) against the raw engines'
``save_checkpoint`` of the same state (which neither checksums nor fsyncs): a time ratio <= 1.0
means hasten saves at least as fast. The load part times ``load_state`` of that checkpoint (every
engine file verified against the manifest, plus hasten's RNG files) against the raw engines'
``load_checkpoint`` of theirs (which verify nothing).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _harness import relaunch_under_torchrun, report, timed
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


def _checkpoints(accelerator: Any, raw: Any, control: Any, rounds: int, root: Path) -> None:
    """save_state of hasten's engine vs save_checkpoint of the raw engines (same model, state)."""

    def saver(engine: Any, name: str) -> Callable[[], None]:
        return lambda: engine.save_checkpoint(str(root / name), tag="pytorch_model")

    def hasten_save() -> None:
        accelerator.save_state(str(root / "hasten"))

    loops = {
        "engine.save_checkpoint": saver(raw, "raw"),
        "save_state": hasten_save,
        "raw control": saver(control, "control"),
    }
    for loop in loops.values():
        loop()  # first saves create the folders and files
    saves = timed(rounds, loops)
    numel = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in raw.parameters())
    report(
        f"save ({numel * 16 / 2**20:.0f} MiB of fp32 weights, master copy and Adam moments) "
        f"to {root}",
        saves,
        "engine.save_checkpoint",
        1e3,
        "ms",
    )


def _loads(accelerator: Any, raw: Any, control: Any, rounds: int, root: Path) -> None:
    """load_state of hasten's checkpoint vs load_checkpoint of the raw engines' (saved above)."""

    def loader(engine: Any, name: str) -> Callable[[], None]:
        return lambda: engine.load_checkpoint(str(root / name), tag="pytorch_model")

    def hasten_load() -> None:
        accelerator.load_state(str(root / "hasten"))

    loops = {
        "engine.load_checkpoint": loader(raw, "raw"),
        "load_state": hasten_load,
        "raw control": loader(control, "control"),
    }
    for loop in loops.values():
        loop()  # warm: the files are in the page cache for every loop alike
    report(f"load from {root}", timed(rounds, loops), "engine.load_checkpoint", 1e3, "ms")


def _burners(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy processes (rank 0 only), to time the loops on a loaded machine."""
    if count <= 0 or dist.get_rank() != 0:
        return []
    spin = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    from hasten import Accelerator
    from hasten.config.deepspeed import DeepSpeedPlugin

    stage, steps, width, depth = args.stage, args.steps, args.width, args.depth
    plugin = DeepSpeedPlugin(hf_ds_config=ds_config(stage))
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin)
    hasten_run, _ = hasten_engine(accelerator, width, depth)
    raw_run, raw = raw_engine(stage, width, depth)
    control_run, control = raw_engine(stage, width, depth)
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        (torch.randn(BATCH, width, generator=g), torch.randn(BATCH, width, generator=g))
        for _ in range(steps)
    ]
    loops = {"hasten": hasten_run, "raw deepspeed": raw_run, "raw control": control_run}
    burners = _burners(args.burn)
    try:
        for run in loops.values():
            run(batches[:3])
        times = timed(args.rounds, {n: (lambda run=run: run(batches)) for n, run in loops.items()})
        per_step = {name: [t / steps for t in ts] for name, ts in times.items()}
        report(
            f"2-process ZeRO-{stage} step, {depth} blocks of width {width}, batch {BATCH}/process, "
            f"gloo, {args.burn} busy processes beside",
            per_step,
            "raw deepspeed",
            1e6,
            "us/step",
        )
        root = Path(args.dir or tempfile.gettempdir()) / "hasten_bench_deepspeed"
        if dist.get_rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
        dist.barrier()
        _checkpoints(accelerator, raw, control, args.save_rounds, root)
        _loads(accelerator, raw, control, args.load_rounds, root)
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--save-rounds", type=int, default=40)
    parser.add_argument("--load-rounds", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: the temp dir)")
    parser.add_argument("--burn", type=int, default=0, help="busy processes to run beside")
    args = parser.parse_args()
    relaunch_under_torchrun(__file__)
    worker(args)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A training script for the exact-resume tests, run as a fresh process (or under hasten launch).

Usage: ``resume_script.py OUT PHASE [--save-at N] [--convention skip|direct] [--step-delay S]
[--save-on-each-node] [--die-at N]``.

It trains a small model with dropout, shuffling, gradient accumulation, an LR scheduler and
fp16 with a GradScaler for EPOCHS epochs, and writes every step's loss and the final weights
to ``OUT/<phase>_<rank>.pt``. Phases: ``full`` (no interruption), ``first`` (stop after
``--save-at`` steps with save_state), ``second`` (load_state, then finish), ``preempt``
(automatic checkpoint naming under ``OUT/project``, so a preemption signal checkpoints and exits;
a restarted attempt resumes with ``load_state()``; results go to ``OUT/attempt<k>_<rank>.pt``),
``elastic`` (as ``preempt``, saving every ``--save-at`` steps; on the first attempt process 1
kills itself with SIGKILL at step ``--die-at``, so a launcher with ``--max_restarts`` restarts
the group). ``--save-on-each-node``: each machine writes a complete checkpoint into its own
``OUT`` (machines that share no folder).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.config.project import ProjectConfiguration
from hasten.utils import set_seed

EPOCHS = 2
SAMPLES = 48
BATCH = 4
ACCUMULATION = 3


def _build(
    seed: int, project: Path | None, save_on_each_node: bool = False
) -> tuple[Accelerator, Any, Any, Any, Any]:
    set_seed(seed)
    config = ProjectConfiguration(save_on_each_node=save_on_each_node)
    if project is not None:
        config = ProjectConfiguration(
            project_dir=str(project),
            automatic_checkpoint_naming=True,
            save_on_each_node=save_on_each_node,
        )
    accelerator = Accelerator(
        cpu=True,
        mixed_precision="fp16",
        gradient_accumulation_steps=ACCUMULATION,
        project_config=config,
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    data = torch.Generator().manual_seed(7)
    dataset = TensorDataset(
        torch.randn(SAMPLES, 6, generator=data), torch.randn(SAMPLES, 1, generator=data)
    )
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True)
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


class Progress:
    """Steps done so far, saved with the checkpoint through register_for_checkpointing."""

    def __init__(self) -> None:
        self.done = 0

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.done = int(state["done"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("phase", choices=["full", "first", "second", "preempt", "elastic"])
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--convention", choices=["skip", "direct"], default="skip")
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--save-on-each-node", action="store_true")
    parser.add_argument("--die-at", type=int, default=0)
    args = parser.parse_args()
    preempt = args.phase in ("preempt", "elastic")
    project = args.out / "project" if preempt else None
    resuming = args.phase == "second" or (
        preempt and (args.out / "project" / "checkpoints").is_dir()
    )
    # A different seed when resuming: everything that matters must come from the checkpoint.
    accelerator, model, optimizer, loader, scheduler = _build(
        1234 if resuming else 0, project, args.save_on_each_node
    )
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if resuming:
        accelerator.load_state(None if preempt else str(args.out / "checkpoint"))
    rank = accelerator.process_index
    phase = args.phase
    if preempt:  # one result file per attempt; the test signals the pid once training runs
        phase = f"attempt{len(list(args.out.glob(f'attempt*_{rank}.pt')))}"
        if args.phase == "elastic":  # a killed process leaves no result file: count restarts
            phase = f"attempt{_attempt()}"
        if phase != "attempt0":
            args.step_delay = 0.0  # only the first attempt is paced for the test's signal
        (args.out / f"pid_{rank}").write_text(str(os.getpid()))
    losses: list[float] = []
    try:
        _train(args, accelerator, model, optimizer, loader, scheduler, progress, losses)
    finally:
        _dump(args.out, phase, accelerator, model, losses)
    return 0


def _train(
    args: argparse.Namespace,
    accelerator: Accelerator,
    model: Any,
    optimizer: Any,
    loader: Any,
    scheduler: Any,
    progress: Progress,
    losses: list[float],
) -> None:
    start_epoch, skip = divmod(progress.done, len(loader))
    for epoch in range(start_epoch, EPOCHS):
        active = loader
        if epoch == start_epoch and skip and args.convention == "skip":
            active = accelerator.skip_first_batches(loader, skip)
        for x, y in active:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.item())
            progress.done += 1
            if args.step_delay:
                (args.out / f"progress_{accelerator.process_index}").write_text(str(progress.done))
                time.sleep(args.step_delay)
            if args.phase == "first" and progress.done == args.save_at:
                accelerator.save_state(str(args.out / "checkpoint"))
                return
            if args.phase == "elastic":
                if progress.done % args.save_at == 0:
                    accelerator.save_state()
                if (
                    _attempt() == 0
                    and accelerator.process_index == 1
                    and progress.done == args.die_at
                ):
                    os.kill(os.getpid(), signal.SIGKILL)
    accelerator.end_training()


def _attempt() -> int:
    """Which attempt of the launcher this is (0 before any restart)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def _dump(out: Path, phase: str, accelerator: Accelerator, model: Any, losses: list[float]) -> None:
    state = accelerator.unwrap_model(model).state_dict()
    torch.save(
        {"losses": losses, "weights": {k: v.detach().clone() for k, v in state.items()}},
        out / f"{phase}_{accelerator.process_index}.pt",
    )


if __name__ == "__main__":
    sys.exit(main())

"""Preemption and restart: a job told to stop checkpoints, exits, and continues when restarted.

Clusters announce the end of a job with a signal (SLURM sends SIGTERM or, with
``--signal=USR1@60``, SIGUSR1 before the time limit; Kubernetes sends SIGTERM). With
``ProjectConfiguration(automatic_checkpoint_naming=True)`` and a ``project_dir``, hasten
catches SIGTERM and SIGUSR1: every process finishes its step, the state is saved, and the job
exits with code 75. ``hasten launch --max_restarts N`` then starts it again, and
``load_state()`` continues exactly where it stopped.

    hasten launch --num_processes 2 --max_restarts 1 examples/by_feature/preemption.py \\
        --preempt_at_step 20

``--preempt_at_step`` makes the first attempt send itself SIGTERM, as a scheduler would.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import ProjectConfiguration, set_seed


class Progress:
    """Optimizer steps done; saved with each checkpoint so a restart knows where it is."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--project_dir", default="preemption_out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--preempt_at_step", type=int, default=0, help="0: never")
    args = parser.parse_args()

    accelerator = Accelerator(
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
        )
    )
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 8, generator=g)
    y = (x[:, 0] > x[:, 1]).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if (Path(args.project_dir) / "checkpoints").is_dir():
        accelerator.load_state()  # the newest complete checkpoint
        accelerator.print(f"attempt {restart}: resumed after {progress.steps} steps")
    else:
        accelerator.print(f"attempt {restart}: starting")

    for epoch in range(progress.steps // len(loader), args.epochs):
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.steps += 1
            if restart == 0 and progress.steps == args.preempt_at_step:
                accelerator.print(f"step {progress.steps}: the scheduler sends SIGTERM")
                os.kill(os.getpid(), signal.SIGTERM)  # hasten saves at the next batch and exits
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.print(f"finished after {progress.steps} steps")
    accelerator.end_training()


if __name__ == "__main__":
    main()

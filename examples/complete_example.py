"""A complete training script: tracking, checkpoints, and resuming exactly where a run stopped.

Everything an experiment needs around the loop: metrics logged to the trackers named by
``--report_to`` (the built-in "jsonl" tracker needs nothing installed; ``hasten plot`` draws
it), a checkpoint every ``--checkpointing_steps`` optimizer steps or every epoch, and
``--resume_from_checkpoint`` to continue from one (``latest`` picks the newest). hasten resumes
mid-epoch exactly: the data order, the position in the epoch, the random state and the
scheduler continue as if the run had never stopped, so a resumed run ends with the same
weights as an uninterrupted one.

    python examples/complete_example.py --checkpointing_steps 10
    python examples/complete_example.py --resume_from_checkpoint latest
    hasten launch --num_processes 2 examples/complete_example.py --checkpointing_steps epoch
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import ProjectConfiguration, set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Two noisy interleaved half-moons in 2-D, lifted to 8 features."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    angle = torch.rand(n, generator=g) * torch.pi
    x = torch.stack([torch.cos(angle) + labels, torch.sin(angle) * (1 - 2 * labels)], dim=1)
    x = x + torch.randn(n, 2, generator=g) * 0.2
    lift = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    return TensorDataset(torch.tanh(x @ lift), labels)


class Progress:
    """Optimizer steps done so far; saved with every checkpoint (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--train_samples", type=int, default=1024)
    parser.add_argument("--project_dir", default="complete_example_out")
    parser.add_argument("--report_to", default="jsonl", help='trackers, comma separated, or "all"')
    parser.add_argument(
        "--checkpointing_steps", default=None, help='save every N optimizer steps, or "epoch"'
    )
    parser.add_argument(
        "--resume_from_checkpoint", default=None, help='a checkpoint folder, or "latest"'
    )
    args = parser.parse_args()

    accelerator = Accelerator(
        log_with=args.report_to.split(","),
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=3
        ),
    )
    set_seed(42)
    accelerator.init_trackers("complete_example", config=vars(args))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_dl = DataLoader(
        make_data(args.train_samples, 1), batch_size=args.batch_size, shuffle=True
    )
    eval_dl = DataLoader(make_data(200, 2), batch_size=args.batch_size)
    scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, 1.0, 0.1, total_iters=args.epochs * len(train_dl)
    )
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, scheduler
    )

    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if args.resume_from_checkpoint:
        # load_state() with no folder loads the newest checkpoint under project_dir/checkpoints.
        folder = None if args.resume_from_checkpoint == "latest" else args.resume_from_checkpoint
        accelerator.load_state(folder)
        accelerator.print(f"resumed after {progress.steps} steps")

    for epoch in range(progress.steps // len(train_dl), args.epochs):
        model.train()
        # A loaded data loader continues where the saved run stopped, mid-epoch included.
        for features, labels in train_dl:
            loss = F.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.steps += 1
            accelerator.log({"train_loss": loss.item()}, step=progress.steps)
            every = args.checkpointing_steps
            if every and every.isdigit() and progress.steps % int(every) == 0:
                accelerator.save_state()
        if args.checkpointing_steps == "epoch":
            accelerator.save_state()
        model.eval()
        correct = seen = 0
        for features, labels in eval_dl:
            with torch.no_grad():
                predictions = model(features).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            seen += len(labels)
        accelerator.log({"accuracy": correct / seen}, step=progress.steps)
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f} accuracy {correct / seen:.3f}")

    weights = sum(p.double().sum().item() for p in accelerator.unwrap_model(model).parameters())
    accelerator.print(f"final weights checksum {weights:.10f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()

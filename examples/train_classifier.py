"""Train a small classifier on synthetic data with hasten: the `make demo` job.

Runs unchanged on one CPU process or many:

    hasten launch --cpu --num_processes 2 examples/train_classifier.py

bf16 autocast, gradient accumulation, a main-process progress bar, evaluation through
`gather_for_metrics` (exactly the evaluation set, no duplicates), and metrics written by the
built-in "jsonl" tracker under ``--project_dir`` so ``hasten plot`` can draw them.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.logging import tqdm
from hasten.utils import set_seed

NUM_CLASSES, FEATURES = 4, 16


def make_data(n: int, seed: int) -> TensorDataset:
    """Gaussian blobs around fixed class centres: learnable, but not trivially."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(NUM_CLASSES, FEATURES, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    features = centres[labels] + torch.randn(n, FEATURES, generator=g) * 3.0
    return TensorDataset(features, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--mixed_precision", default="bf16")
    parser.add_argument("--project_dir", default="demo_out")
    args = parser.parse_args()

    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=["jsonl"],
        project_dir=args.project_dir,
    )
    set_seed(42)
    accelerator.init_trackers("train_classifier", config=vars(args))

    train_dl = DataLoader(make_data(2048, seed=1), batch_size=args.batch_size, shuffle=True)
    # 1000 is not a multiple of num_processes x batch size: gather_for_metrics drops the padding.
    eval_dl = DataLoader(make_data(1000, seed=2), batch_size=args.batch_size)
    model = nn.Sequential(
        nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = args.epochs * len(train_dl) // args.gradient_accumulation_steps
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps + 1)
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, scheduler
    )

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for features, labels in tqdm(train_dl, desc=f"epoch {epoch}"):
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(features), labels)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                accelerator.log({"train/loss": loss.item()}, step=step)

        model.eval()
        correct = total = 0
        with torch.no_grad():
            for features, labels in eval_dl:
                preds = model(features).argmax(dim=-1)
                preds, labels = accelerator.gather_for_metrics((preds, labels))
                correct += int((preds == labels).sum())
                total += labels.numel()
        accuracy = correct / total
        accelerator.log({"eval/accuracy": accuracy}, step=step)
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f} on {total} samples")

    accelerator.end_training()


if __name__ == "__main__":
    main()

"""Train a small convolutional image classifier with hasten.

The images are synthetic (16x16, one channel): each class is a stripe orientation hidden in
noise, so a two-layer CNN learns it in a couple of epochs on CPU. Evaluation gathers the
predictions of every process with `gather_for_metrics`.

    python examples/cv_example.py
    hasten launch --num_processes 2 examples/cv_example.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import set_seed

SIZE, CLASSES = 16, 4


def stripes(n: int, seed: int) -> TensorDataset:
    """Images of horizontal, vertical and two diagonal stripes (one per class) plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    rows, cols = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    patterns = torch.stack([rows, cols, rows + cols, rows - cols]).float()
    images = torch.sin(patterns[labels] * 1.5)[:, None]
    images = images + torch.randn(n, 1, SIZE, SIZE, generator=g) * 1.5
    return TensorDataset(images, labels)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, CLASSES),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--train_samples", type=int, default=2048)
    parser.add_argument("--mixed_precision", default="no", choices=["no", "bf16", "fp16"])
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(0)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train_dl = DataLoader(stripes(args.train_samples, 1), batch_size=args.batch_size, shuffle=True)
    eval_dl = DataLoader(stripes(300, 2), batch_size=args.batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs * len(train_dl))
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, scheduler
    )

    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for images, labels in train_dl:
            loss = F.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            total += loss.item()
        model.eval()
        correct = seen = 0
        for images, labels in eval_dl:
            with torch.no_grad():
                predictions = model(images).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            seen += len(labels)
        accelerator.print(
            f"epoch {epoch}: loss {total / len(train_dl):.4f} accuracy {correct / seen:.3f} "
            f"({seen} samples)"
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()

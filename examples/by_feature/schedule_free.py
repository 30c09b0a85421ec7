"""Schedule-free AdamW: no learning-rate schedule, and `optimizer.train()` / `optimizer.eval()`.

Schedule-free optimizers (the ``schedulefree`` package) keep two sequences of weights: one to
take gradients at, one to evaluate. The prepared optimizer forwards ``train()`` and ``eval()``
to them, so switch it with the model before training and before evaluating. No scheduler is
prepared.

    pip install schedulefree
    python examples/by_feature/schedule_free.py
"""

from __future__ import annotations

import argparse

import schedulefree
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import set_seed


def rings(n: int, seed: int) -> TensorDataset:
    """Points on two noisy concentric rings; the label is the ring."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    angle = torch.rand(n, generator=g) * 2 * torch.pi
    radius = 1.0 + labels + 0.25 * torch.randn(n, generator=g)
    return TensorDataset(torch.stack([radius * angle.cos(), radius * angle.sin()], 1), labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    accelerator = Accelerator()
    set_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = schedulefree.AdamWScheduleFree(model.parameters(), lr=1e-2, warmup_steps=10)
    train_dl = DataLoader(rings(1024, 1), batch_size=32, shuffle=True)
    eval_dl = DataLoader(rings(300, 2), batch_size=64)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    for epoch in range(args.epochs):
        model.train()
        optimizer.train()
        for inputs, labels in train_dl:
            loss = F.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        optimizer.eval()  # evaluate at the averaged weights
        correct = seen = 0
        for inputs, labels in eval_dl:
            with torch.no_grad():
                predictions = model(inputs).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            seen += len(labels)
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f} accuracy {correct / seen:.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()

"""Metrics over several processes: every evaluation sample counted exactly once.

Each process evaluates its share of the data. To even out the last batch, the prepared loader
repeats a few samples on some processes; `gather_for_metrics` collects the predictions of all
processes and drops those repeats, so the metric covers the evaluation set exactly (here 1001
samples, which no batch size x 2 processes divides).

    hasten launch --num_processes 2 examples/by_feature/multi_process_metrics.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import set_seed


def blobs(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=g)
    centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    return TensorDataset(centres[labels] + torch.randn(n, 2, generator=g), labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--eval_samples", type=int, default=1001)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    accelerator = Accelerator()
    set_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train_dl = DataLoader(blobs(1024, 1), batch_size=32, shuffle=True)
    eval_dl = DataLoader(blobs(args.eval_samples, 2), batch_size=16)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    for epoch in range(args.epochs):
        model.train()
        for inputs, labels in train_dl:
            loss = F.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        seen_here = 0
        all_predictions, all_labels = [], []
        for inputs, labels in eval_dl:
            seen_here += len(labels)  # this process's share, padding included
            with torch.no_grad():
                predictions = model(inputs).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            all_predictions.append(predictions)
            all_labels.append(labels)
        predictions, labels = torch.cat(all_predictions), torch.cat(all_labels)
        accuracy = (predictions == labels).float().mean().item()
        accelerator.print(
            f"epoch {epoch}: loss {loss.item():.4f} accuracy {accuracy:.3f} over {len(labels)} "
            f"samples ({seen_here} on the main process)"
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()

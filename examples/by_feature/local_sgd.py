"""LocalSGD: each process takes several optimizer steps on its own, then the models are averaged.

Across slow links, synchronising every step is the bottleneck; with ``LocalSGD`` the processes
train independently (no gradient all-reduce) and average their parameters every
``--local_sgd_steps`` steps, and once more on leaving the ``with`` block. Run it on 2 or more
processes (on one it changes nothing):

    hasten launch --num_processes 2 examples/by_feature/local_sgd.py --local_sgd_steps 8
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.local_sgd import LocalSGD
from hasten.utils import reduce, set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_sgd_steps", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1024)
    args = parser.parse_args()

    accelerator = Accelerator()
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 10, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    with LocalSGD(
        accelerator=accelerator, model=model, local_sgd_steps=args.local_sgd_steps, enabled=True
    ) as local_sgd:
        for epoch in range(args.epochs):
            for inputs, labels in loader:
                with accelerator.no_sync(model):  # no per-step gradient all-reduce
                    loss = F.cross_entropy(model(inputs), labels)
                    accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()  # averages the parameters every local_sgd_steps calls
            accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")

    # Leaving the block averaged the models one last time: every process holds the same weights.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = (reduce(flat, reduction="sum") / accelerator.num_processes - flat).abs().max()
    accelerator.print(f"largest difference from the mean model after training: {spread.item():.2e}")
    accelerator.end_training()


if __name__ == "__main__":
    main()

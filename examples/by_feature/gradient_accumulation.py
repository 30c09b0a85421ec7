"""Gradient accumulation: a large effective batch from small ones, with `accelerator.accumulate`.

Inside ``with accelerator.accumulate(model):`` the optimizer and scheduler only really step
every ``--gradient_accumulation_steps`` batches, and processes skip the gradient all-reduce on
the batches in between (``accelerator.sync_gradients`` says which batch steps). The loss needs
no manual division: `backward` scales it.

    python examples/by_feature/gradient_accumulation.py --gradient_accumulation_steps 4
    hasten launch --num_processes 2 examples/by_feature/gradient_accumulation.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 10, generator=g)
    y = x @ torch.randn(10, 1, generator=g) + 0.1 * torch.randn(args.samples, 1, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    updates = 0
    for epoch in range(args.epochs):
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()  # a real step only when the cycle is complete
                optimizer.zero_grad()
            updates += int(accelerator.sync_gradients)
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    per_update = args.batch_size * args.gradient_accumulation_steps * accelerator.num_processes
    accelerator.print(
        f"{updates} optimizer updates for {len(loader) * args.epochs} batches per process "
        f"(effective batch {per_update})"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()

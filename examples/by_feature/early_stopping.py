"""Early stopping across processes: any process can decide, and all of them stop together.

A process that sees its stopping condition calls ``accelerator.set_trigger()``;
``accelerator.check_trigger()`` then returns True on every process at the same step, so no
process is left waiting in a collective for peers that already left the loop.

    python examples/by_feature/early_stopping.py --target_loss 0.05
    hasten launch --num_processes 2 examples/by_feature/early_stopping.py
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
    parser.add_argument("--target_loss", type=float, default=0.05)
    parser.add_argument("--max_epochs", type=int, default=50)
    args = parser.parse_args()

    accelerator = Accelerator()
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = 0
    for epoch in range(args.max_epochs):
        for inputs, targets in loader:
            loss = F.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if loss.item() < args.target_loss:
                accelerator.set_trigger()  # this process wants to stop
            if accelerator.check_trigger():  # True everywhere once any process set it
                break
        else:
            continue
        accelerator.print(f"stopped early at step {step} (epoch {epoch}): loss {loss.item():.4f}")
        break
    else:
        accelerator.print(f"did not reach the target in {args.max_epochs} epochs")
    accelerator.end_training()


if __name__ == "__main__":
    main()

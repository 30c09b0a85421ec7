"""Train on several processes from Python itself (a notebook cell, a plain script): `notebook_launcher`.

`notebook_launcher(function, args, num_processes=N)` forks N workers and runs
``function(*args)`` in each, joined in one process group: no ``hasten launch`` and no script
file needed. Create the `Accelerator` inside the function, never before the call.

    python examples/notebook_launcher.py --num_processes 2
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, notebook_launcher
from hasten.utils import get_free_port, set_seed


def training_function(epochs: int) -> None:
    accelerator = Accelerator()  # inside the function: each worker builds its own
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 6, generator=g)
    y = (x.sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.print(f"trained on {accelerator.num_processes} processes")
    accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    # A free port, so that two jobs on one machine do not meet (the default is 29500).
    port = str(get_free_port())
    notebook_launcher(
        training_function, (args.epochs,), num_processes=args.num_processes, use_port=port
    )


if __name__ == "__main__":
    main()

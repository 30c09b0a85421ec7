"""Tensor parallelism of a plain PyTorch model, from the plan it carries.

A model that declares a ``tp_plan`` (module-name patterns -> "colwise" / "rowwise", the
convention transformers uses) is split by `prepare` when the Accelerator has a
`ParallelismConfig` with ``tp_size``: each process holds a slice of every planned weight, and
the matrix products are combined across the tensor-parallel group. Processes beyond
``tp_size`` form data-parallel replicas.

    hasten launch --num_processes 2 examples/by_feature/tensor_parallel.py --tp_size 2
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import ParallelismConfig, set_seed


class FeedForward(nn.Module):
    """An MLP block; the up projection is split by columns, the down projection by rows."""

    tp_plan = {"up": "colwise", "down": "rowwise"}

    def __init__(self, width: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tp_size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=args.tp_size))
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 32, generator=g)
    y = torch.tanh(x.roll(1, dims=1))  # a target the block can learn
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = FeedForward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    local = model.up.weight.to_local().shape  # this process's slice of the weight
    accelerator.print(
        f"tensor parallel over {args.tp_size} processes: up.weight {tuple(model.up.weight.shape)}"
        f" holds {tuple(local)} here"
    )

    for epoch in range(args.epochs):
        for inputs, targets in loader:
            loss = F.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()

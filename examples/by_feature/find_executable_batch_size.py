"""Find the largest batch that fits, and keep the effective batch by accumulating gradients.

`find_executable_batch_size` calls the training function with ``starting_batch_size``; when it
runs out of memory, it frees what it can and calls again with a batch 10% smaller, until one
fits. Here the training function also sets gradient accumulation so that the effective batch
stays ``--target_batch_size``, whatever batch the memory allowed. On a GPU the out-of-memory
error comes from the device; on a CPU run, ``--memory_budget`` plays the device (a batch
larger than it raises the same error).

    python examples/by_feature/find_executable_batch_size.py --memory_budget 32
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import find_executable_batch_size, set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starting_batch_size", type=int, default=128)
    parser.add_argument("--target_batch_size", type=int, default=128)
    parser.add_argument("--memory_budget", type=int, default=32, help="largest batch that 'fits'")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    accelerator = Accelerator()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 16, generator=g)
    y = (x[:, 0] * x[:, 1] > 0).long()

    @find_executable_batch_size(starting_batch_size=args.starting_batch_size)
    def train(batch_size: int) -> None:
        accelerator.free_memory()  # drop what the failed attempt prepared
        set_seed(0)
        accelerator.print(f"trying batch size {batch_size}")
        steps = math.ceil(args.target_batch_size / batch_size)
        accelerator.gradient_accumulation_steps = steps
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for epoch in range(args.epochs):
            for inputs, labels in loader:
                if len(inputs) > args.memory_budget:  # what a device would do
                    raise torch.OutOfMemoryError(f"batch of {len(inputs)} does not fit")
                with accelerator.accumulate(model):
                    loss = F.cross_entropy(model(inputs), labels)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
            accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
        accelerator.print(
            f"trained with batch size {batch_size} x {steps} accumulation steps "
            f"(effective {batch_size * steps * accelerator.num_processes})"
        )

    train()
    accelerator.end_training()


if __name__ == "__main__":
    main()

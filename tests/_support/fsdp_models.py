"""A tiny transformer-like model and one training loop shared by the FSDP/DDP tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["Block", "TinyTransformer", "batches", "prepared_and_trained", "train"]


class Block(nn.Module):
    """Pre-norm residual MLP block: what transformer_based_wrap shards one by one."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TinyTransformer(nn.Module):
    """Embedding, two blocks, head; declares its block class like Hugging Face models do."""

    _no_split_modules = ["Block"]

    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def batches(rank: int, world: int, count: int, size: int = 4) -> list[tuple[torch.Tensor, ...]]:
    """This rank's share of a fixed data set: the same global batches for every strategy."""
    generator = torch.Generator().manual_seed(1234)
    data = [
        (
            torch.randn(size * world, 8, generator=generator),
            torch.randn(size * world, 4, generator=generator),
        )
        for _ in range(count)
    ]
    return [(x[rank::world], y[rank::world]) for x, y in data]


def train(
    accelerator: Any,
    model: Any,
    optimizer: Any,
    steps: int,
    clip: float | None = None,
    start: int = 0,
) -> list[float]:
    """Run micro-batches ``start`` .. ``start + steps`` under accumulate; return the losses."""
    losses = []
    data = batches(accelerator.process_index, accelerator.num_processes, start + steps)
    for x, y in data[start:]:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
            accelerator.backward(loss)
            if clip is not None and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def prepared_and_trained(accelerator: Any, steps: int) -> tuple[Any, Any]:
    """A seeded TinyTransformer and its AdamW, prepared by ``accelerator`` and trained ``steps``."""
    torch.manual_seed(0)
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    train(accelerator, model, optimizer, steps)
    return model, optimizer

"""A tiny language model that carries a tensor-parallel plan (transformers' pattern syntax)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Block", "TinyLM"]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.relu(self.up(x))))


class TinyLM(nn.Module):
    """Embedding, two MLP blocks and a head; its plan uses transformers' pattern syntax."""

    tp_plan = {
        "embed": "rowwise",
        "blocks.*.up": "colwise",
        "blocks.*.down": "rowwise",
        "head": "colwise_rep",
    }

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

"""Tiny models shared by the big-modeling tests (pure torch; built in milliseconds)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A residual transformer-like block: attention-ish mixing and an MLP."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn(self.ln(x)).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        x = x + self.proj(weights @ v)
        return x + self.mlp(x)


class TinyLM(nn.Module):
    """Embedding tied to the output head, a stack of blocks, a final norm, a position buffer."""

    def __init__(self, vocab: int = 50, dim: int = 16, layers: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.h = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) * (1 + self.scale)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

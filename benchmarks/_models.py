"""The block model the 2-process benchmarks train (bench_fsdp, bench_fsdp_memory, bench_nd, bench_tp).

`BlockModel` is a stack of residual MLP blocks: it has ``_no_split_modules`` (FSDP's
transformer-based wrap shards each `Block`) and a ``tp_plan`` (tensor parallel splits ``up``
column-wise and ``down`` row-wise), so every engine benchmark times the same network.
Import it as ``from _models import ...``: Python puts the script's folder on ``sys.path``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Block", "BlockModel", "PreNormBlock", "Tower"]


class Block(nn.Module):
    """``x + down(relu(up(x)))`` with a 4x wider hidden layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class BlockModel(nn.Module):
    """``depth`` blocks of ``width`` features, applied in order."""

    tp_plan = {"layers.*.up": "colwise", "layers.*.down": "rowwise"}
    _no_split_modules = ["Block"]

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class PreNormBlock(nn.Module):
    """``x + down(gelu(up(norm(x))))``: a transformer MLP block, what FSDP's wrap shards one by one."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Tower(nn.Module):
    """``depth`` pre-norm blocks of ``width`` features and a linear head (bench_compile, gpu_fsdp)."""

    _no_split_modules = ["PreNormBlock"]

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PreNormBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)

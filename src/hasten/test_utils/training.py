"""Tiny models and data that downstream tests import from ``accelerate.test_utils.training``:
``y = a * x + b`` regression, learnable in a few steps on any device.
"""

from __future__ import annotations

from typing import Any

import torch

from hasten.core.imports import require

__all__ = ["RegressionDataset", "RegressionModel", "RegressionModel4XPU"]


class RegressionDataset:
    """``length`` samples ``{"x", "y"}`` with ``y = a * x + b`` plus noise (numpy, seeded)."""

    def __init__(
        self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None
    ) -> None:
        np = require("numpy", feature="RegressionDataset")  # optional: numpy
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = a * self.x + b + rng.normal(scale=0.1, size=(length,)).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i]}


class RegressionModel(torch.nn.Module):
    """``x * a + b`` with scalar parameters ``a`` and ``b``; prints the dtypes on its first batch."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.first_batch = True

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        if x is None:
            raise ValueError("RegressionModel.forward needs the input tensor x")
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b


class RegressionModel4XPU(torch.nn.Module):
    """`RegressionModel` with 2-element parameters (only the first is used), for XPU tests."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([2, 3]).float())
        self.b = torch.nn.Parameter(torch.tensor([2, 3]).float())
        self.first_batch = True

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        if x is None:
            raise ValueError("RegressionModel4XPU.forward needs the input tensor x")
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a[0] + self.b[0]

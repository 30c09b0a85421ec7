"""hasten.test_utils.training: the regression data is seeded and the model learns it."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from hasten import Accelerator
from hasten.test_utils import RegressionDataset, RegressionModel, RegressionModel4XPU

pytest.importorskip("numpy", reason="RegressionDataset draws its data with numpy")


def test_dataset_is_seeded_and_follows_the_line() -> None:
    a, b = RegressionDataset(length=32, seed=42), RegressionDataset(length=32, seed=42)
    assert len(a) == 32 and set(a[0]) == {"x", "y"}
    assert (a.x == b.x).all() and (a.y == b.y).all()
    assert not (RegressionDataset(length=32, seed=1).x == a.x).all()
    residual = a.y - (2 * a.x + 3)
    assert abs(float(residual.mean())) < 0.1 and float(residual.std()) < 0.2


def test_model_learns_a_and_b_through_the_accelerator(capsys: pytest.CaptureFixture[str]) -> None:
    acc = Accelerator(cpu=True)
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(RegressionDataset(length=64, seed=0), batch_size=16)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    for _ in range(20):
        for batch in loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    assert abs(model.a.item() - 2) < 0.1 and abs(model.b.item() - 3) < 0.1
    assert capsys.readouterr().out.count("Model dtype: torch.float32") == 1  # first batch only


def test_xpu_variant_and_missing_input() -> None:
    model = RegressionModel4XPU()
    assert model(torch.tensor([1.0])).item() == 4.0  # 1 * a[0] + b[0] = 2 + 2
    with pytest.raises(ValueError, match="needs the input tensor x"):
        RegressionModel()()

"""Accelerator with mixed_precision="fp8": recipe handlers, backend, errors, the torchao path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hasten import Accelerator
from hasten.config.enums import FP8BackendType
from hasten.config.kwargs import AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from hasten.core.imports import is_torchao_available
from hasten.precision import fp8 as fp8_module

needs_torchao = pytest.mark.skipif(not is_torchao_available(), reason="torchao is not installed")


def transformerish() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64),
        nn.GELU(),
        nn.Linear(64, 64),
        nn.GELU(),
        nn.Linear(64, 64),
        nn.Linear(64, 4),
    )


@needs_torchao
def test_fp8_on_cpu_fails_at_construction_naming_hardware_and_bf16() -> None:
    with pytest.raises(ValueError, match=r"needs an NVIDIA GPU with fp8 matmuls.*'bf16'"):
        Accelerator(mixed_precision="fp8", cpu=True)


def test_two_fp8_recipes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"Several fp8 recipes.*AORecipeKwargs, TERecipeKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs(), TERecipeKwargs()])


def test_recipe_without_fp8_is_refused() -> None:
    with pytest.raises(ValueError, match=r"MSAMPRecipeKwargs.*mixed_precision='fp8'"):
        Accelerator(cpu=True, kwargs_handlers=[MSAMPRecipeKwargs()])


def test_fp8_backend_without_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.fp8_backend is FP8BackendType.NO
    assert not accelerator.fp8_enabled
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    assert accelerator.fp8_backend is FP8BackendType.TE


@needs_torchao
def test_torchao_training_through_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchao's fp8 layers also run (emulated) on CPU; only the hardware gate is lifted here.
    from torchao.float8.float8_linear import Float8Linear

    monkeypatch.setattr(fp8_module, "_check_hardware", lambda device, backend: None)
    accelerator = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    assert accelerator.fp8_enabled and accelerator.fp8_backend is FP8BackendType.AO
    assert accelerator.ao_recipe_handler is not None
    model = transformerish()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 2
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    losses = []
    for _ in range(12):
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@needs_torchao
def test_fp8_backend_from_launcher_without_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp8_module, "_check_hardware", lambda device, backend: None)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "AO")
    accelerator = Accelerator(cpu=True)
    assert accelerator.mixed_precision == "fp8"
    assert accelerator.fp8_backend is FP8BackendType.AO

"""Accelerator.lomo_backward with the real lomo-optim package; should_save_model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hasten import Accelerator
from hasten.checkpointing.model import saves_model_in_mesh
from hasten.config.parallelism import ParallelismConfig
from hasten.core.imports import is_lomo_available

needs_lomo = pytest.mark.skipif(
    not is_lomo_available(), reason="lomo-optim is not installed (pip install lomo-optim)"
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


@needs_lomo
def test_lomo_backward_updates_like_sgd_in_one_pass() -> None:
    from lomo_optim import Lomo  # optional: lomo-optim

    acc = Accelerator(cpu=True)
    model = _model()
    reference = copy.deepcopy(model)
    model, optimizer = acc.prepare(model, Lomo(model, lr=0.1))
    x = torch.randn(5, 3)
    acc.lomo_backward(model(x).pow(2).mean(), learning_rate=0.05)
    reference(x).pow(2).mean().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach() - 0.05 * q.grad)
        assert p.grad is None  # the fused update consumed every gradient


@needs_lomo
def test_backward_with_learning_rate_is_a_lomo_step_as_in_accelerate() -> None:
    from lomo_optim import Lomo  # optional: lomo-optim

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = _model()
    reference = copy.deepcopy(model)
    model, _ = acc.prepare(model, Lomo(model, lr=0.1))
    assert acc.has_lomo_optimizer
    x = torch.randn(5, 3)
    acc.backward(model(x).pow(2).mean(), learning_rate=0.05)  # transformers' Trainer does this
    (reference(x).pow(2).mean() / 2).backward()  # divided by the accumulation steps
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach() - 0.05 * q.grad)
    plain = Accelerator(cpu=True)
    plain.prepare(torch.optim.SGD(_model().parameters(), lr=0.1))
    assert not plain.has_lomo_optimizer


@needs_lomo
@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="AdaLomo allocates its state with .cuda() (needs CUDA)"
)
def test_adalomo_backward_changes_the_weights() -> None:
    from lomo_optim import AdaLomo  # optional: lomo-optim

    acc = Accelerator()
    model = _model().to(acc.device)
    before = [p.detach().clone() for p in model.parameters()]
    model, _ = acc.prepare(model, AdaLomo(model, lr=0.01))
    acc.lomo_backward(model(torch.randn(4, 3, device=acc.device)).pow(2).mean(), 0.01)
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), before))


@needs_lomo
def test_lomo_backward_bad_inputs() -> None:
    from lomo_optim import Lomo  # optional: lomo-optim

    acc = Accelerator(cpu=True)
    model = _model()
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = model(torch.randn(2, 3)).sum()
    with pytest.raises(ValueError, match="none was prepared"):
        acc.lomo_backward(loss, 0.1)
    with pytest.raises(ValueError, match="A learning rate must be passed"):
        acc.lomo_backward(loss, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="finite number"):
        acc.lomo_backward(loss, "0.1")  # type: ignore[arg-type]
    other = _model()
    acc.prepare(Lomo(other, lr=0.1), Lomo(other, lr=0.1))
    with pytest.raises(ValueError, match="2 LOMO optimizers"):
        acc.lomo_backward(loss, 0.1)


def test_lomo_backward_without_the_package_names_the_pip_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hasten.core.imports as imports

    monkeypatch.setattr(imports, "is_package_available", lambda *a, **k: False)
    acc = Accelerator(cpu=True)
    with pytest.raises(ImportError, match="pip install 'lomo-optim'"):
        acc.lomo_backward(torch.tensor(1.0, requires_grad=True), 0.1)


def test_should_save_model_is_the_local_main_process_without_parallelism_config() -> None:
    acc = Accelerator(cpu=True)
    assert acc.should_save_model is True
    assert acc.should_save_model == acc.is_local_main_process


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ({"dp_replicate_size": 2, "dp_shard_size": 2}, [True, True, False, False]),
        ({"dp_shard_size": 2, "cp_size": 2}, [True, False, True, False]),
        ({"dp_shard_size": 2, "tp_size": 2}, [True, True, True, True]),
    ],
)
def test_should_save_model_in_a_mesh_is_coordinate_zero_of_the_copy_dims(
    sizes: dict[str, int], expected: list[bool]
) -> None:
    config = ParallelismConfig(**sizes)
    assert [saves_model_in_mesh(config, rank) for rank in range(4)] == expected

"""`Accelerator` on 2 forked CPU processes joined by gloo (fast; the CLI tests cover launch)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def _ddp_setup() -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.config.kwargs import DistributedDataParallelKwargs
    from hasten.strategies import DDPStrategy

    handler = DistributedDataParallelKwargs(bucket_cap_mb=5, comm_hook="fp16")
    acc = Accelerator(cpu=True, kwargs_handlers=[handler])
    model = acc.prepare(_model())
    x = torch.full((2, 4), float(acc.process_index + 1))
    acc.backward(model(x).sum())
    return {
        "strategy": isinstance(acc.strategy, DDPStrategy),
        "wrapped": type(model).__name__,
        "bucket": model.bucket_bytes_cap,
        "unwrapped": type(acc.unwrap_model(model)).__name__,
        "grad": acc.unwrap_model(model)[0].weight.grad.tolist(),
        "num_processes": acc.num_processes,
    }


@pytest.mark.timeout(60)
def test_ddp_wrapping_with_kwargs_and_comm_hook() -> None:
    results = run_distributed(_ddp_setup, world_size=2)
    for r in results:
        assert r["strategy"]
        assert r["wrapped"] == "DistributedDataParallel"
        assert r["bucket"] == 5 * 1024 * 1024
        assert r["unwrapped"] == "Sequential"
        assert r["num_processes"] == 2
    # fp16-compressed all-reduce: both ranks hold the same averaged gradient.
    torch.testing.assert_close(torch.tensor(results[0]["grad"]), torch.tensor(results[1]["grad"]))


def _evaluated_then_trained() -> dict[str, Any]:
    from hasten import Accelerator

    acc = Accelerator(cpu=True)
    model = _model()
    evaluated = acc.prepare_model(model, evaluation_mode=True)  # Trainer.evaluate() first
    acc.free_memory()  # then Trainer.train() frees memory and prepares the model again
    trained = acc.prepare(model)
    again = acc.prepare(trained)
    return {
        "evaluated": type(evaluated).__name__,
        "trained": type(trained).__name__,
        "handed_back": again is trained,
    }


@pytest.mark.timeout(60)
def test_a_model_evaluated_first_is_wrapped_in_ddp_for_training() -> None:
    # Accelerate hands the marked model back unwrapped here (training without DDP); hasten
    # remembers that it was prepared for evaluation only.
    for r in run_distributed(_evaluated_then_trained, world_size=2):
        assert r == {
            "evaluated": "Sequential",
            "trained": "DistributedDataParallel",
            "handed_back": True,
        }


def _accumulation_grads() -> list[bool]:
    from hasten import Accelerator

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = acc.prepare(_model())
    loader = acc.prepare(DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=2))
    same: list[bool] = []
    for (x,) in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())
            grad = acc.unwrap_model(model)[0].weight.grad.clone()
            both = acc.gather(grad[None])
            same.append(bool(torch.allclose(both[0], both[1])))
    return same


@pytest.mark.timeout(60)
def test_accumulation_syncs_only_on_sync_steps() -> None:
    for same in run_distributed(_accumulation_grads, world_size=2):
        # Different data per rank: gradients agree only after an all-reduce (every 2nd batch).
        assert same == [False, True, False, True]


def _collectives() -> dict[str, Any]:
    from hasten import Accelerator

    acc = Accelerator(cpu=True)
    rank = acc.process_index
    t = torch.tensor([float(rank)])
    padded = acc.pad_across_processes(torch.ones(rank + 1))
    with acc.split_between_processes(list(range(5))) as share:
        mine = share
    if rank == 1:
        acc.set_trigger()
    return {
        "gather": acc.gather(t).tolist(),
        "reduce": acc.reduce(t).tolist(),
        "padded": padded.tolist(),
        "share": mine,
        "trigger": acc.check_trigger(),
        "main": acc.is_main_process,
        "last": acc.is_last_process,
    }


@pytest.mark.timeout(60)
def test_collectives_and_process_helpers() -> None:
    r0, r1 = run_distributed(_collectives, world_size=2)
    assert r0["gather"] == r1["gather"] == [0.0, 1.0]
    assert r0["reduce"] == [1.0]
    assert r0["padded"] == [1.0, 0.0]
    assert r1["padded"] == [1.0, 1.0]
    assert r0["share"] == [0, 1, 2]
    assert r1["share"] == [3, 4]
    assert r0["trigger"] is r1["trigger"] is True
    assert (r0["main"], r0["last"], r1["main"], r1["last"]) == (True, False, False, True)


def _split_batches_bad_size() -> str:
    from hasten import Accelerator

    acc = Accelerator(cpu=True, split_batches=True)
    try:
        acc.prepare(DataLoader(TensorDataset(torch.arange(9.0)), batch_size=3))
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.timeout(60)
def test_split_batches_needs_a_divisible_batch_size() -> None:
    for message in run_distributed(_split_batches_bad_size, world_size=2):
        assert (
            "batch size (3) needs to be a round multiple of the number of processes (2)" in message
        )


def _train_weights() -> list[list[float]]:
    from hasten import Accelerator

    acc = Accelerator(cpu=True)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=4))
    for x, y in loader:
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    # Plain lists: tensors would travel through shared memory that dies with the worker.
    return [p.detach().tolist() for p in acc.unwrap_model(model).parameters()]


@pytest.mark.timeout(60)
def test_two_processes_match_one_process_with_the_global_batch() -> None:
    w0, w1 = run_distributed(_train_weights, world_size=2)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    x_all, y_all = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    for start in range(0, 16, 8):
        F.mse_loss(model(x_all[start : start + 8]), y_all[start : start + 8]).backward()
        opt.step()
        opt.zero_grad()
    for a, b, ref in zip(w0, w1, model.parameters()):
        assert a == b
        torch.testing.assert_close(torch.tensor(a), ref.detach(), rtol=1e-5, atol=1e-6)


def _trigger_sync() -> list[bool]:
    from hasten import Accelerator

    acc = Accelerator(cpu=True)
    model = acc.prepare(_model())
    inner = acc.unwrap_model(model)
    x = torch.full((2, 4), float(acc.process_index + 1))
    agree = []
    with acc.no_sync(model):
        acc.backward(model(x).sum())
        both = acc.gather(inner[0].weight.grad[None].clone())
        agree.append(bool(torch.allclose(both[0], both[1])))
        model.zero_grad()
        with Accelerator.trigger_sync_in_backward(model):
            acc.backward(model(x).sum())
        both = acc.gather(inner[0].weight.grad[None].clone())
        agree.append(bool(torch.allclose(both[0], both[1])))
    return agree


@pytest.mark.timeout(60)
def test_trigger_sync_in_backward_all_reduces_inside_no_sync() -> None:
    for agree in run_distributed(_trigger_sync, world_size=2):
        assert agree == [False, True]


class _Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(3.0))


def _uneven_join() -> dict[str, Any]:
    from hasten import Accelerator

    acc = Accelerator(cpu=True)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # 10 samples, batch 2: 5 batches, so rank 0 gets 3 and rank 1 gets 2 without even_batches.
    loader = DataLoader(TensorDataset(torch.randn(10, 4)), batch_size=2)
    model, opt, loader = acc.prepare(model, opt, loader)
    seen = 0
    with acc.join_uneven_inputs([model], even_batches=False):
        for (x,) in loader:
            acc.backward(model(x).sum())
            opt.step()
            opt.zero_grad()
            seen += 1
    # an iterable dataset's loader cannot take the override: said, as Accelerate does
    stream = acc.prepare(DataLoader(_Stream(), batch_size=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with acc.join_uneven_inputs([model], even_batches=False):
            pass
    del stream
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return {"seen": seen, "restored": loader.batch_sampler.even_batches, "said": said}


@pytest.mark.timeout(60)
def test_join_uneven_inputs_lets_the_longer_rank_finish() -> None:
    r0, r1 = run_distributed(_uneven_join, world_size=2)
    assert (r0["seen"], r1["seen"]) == (3, 2)
    assert r0["restored"] is True
    assert any("only supported for map-style datasets" in m for m in r0["said"])

"""Tensor parallelism on 2 gloo processes: a plain PyTorch model sharded from its ``tp_plan``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from _support.distributed import run_distributed
from _support.tp_models import TinyLM

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore:Slicing a flattened")]


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        (torch.randint(0, 16, (4, 6), generator=generator),) * 2  # type: ignore[misc]
        for _ in range(3)
    ]


def _train(tp_size: int) -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig

    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    config = ParallelismConfig(tp_size=tp_size) if tp_size > 1 else None
    accelerator = Accelerator(parallelism_config=config)
    model, optimizer = accelerator.prepare(model, optimizer)
    norms = []
    for ids, target in _batches():
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 16), target.reshape(-1))
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
        optimizer.step()
        optimizer.zero_grad()
    from torch.distributed.tensor import DTensor

    kinds = {n: isinstance(p, DTensor) for n, p in model.named_parameters()}
    full = accelerator.get_state_dict(model)
    return {
        "weights": {k: v.detach().tolist() for k, v in full.items()},
        "norms": norms,
        "kinds": kinds,
        "local_rows": model.blocks[0].up.weight.to_local().shape[0] if tp_size > 1 else 16,
        "strategy": accelerator.strategy.name,
    }


@pytest.mark.timeout(180)
def test_tensor_parallel_matches_one_process() -> None:
    reference = _train(1)
    from hasten.state._shared import reset_state

    reset_state()
    ranks = run_distributed(_train, 2, world_size=2, timeout=150)
    for result in ranks:
        assert result["strategy"] == "tensor_parallel"
        assert result["local_rows"] == 8  # each process holds half of the colwise weight
        assert result["kinds"]["blocks.0.up.weight"] and result["kinds"]["embed.weight"]
        assert not result["kinds"]["blocks.0.norm.weight"]  # outside the plan: plain
        assert result["norms"] == pytest.approx(reference["norms"], rel=1e-5)
        assert result["weights"].keys() == reference["weights"].keys()
        for name, value in reference["weights"].items():
            torch.testing.assert_close(
                torch.tensor(result["weights"][name]), torch.tensor(value), rtol=1e-5, atol=1e-6
            )


def _bad(case: str) -> str:
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig

    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    model: nn.Module = TinyLM()
    if case == "no_plan":
        model = nn.Sequential(nn.Linear(4, 4))
    elif case == "missing":
        model.tp_plan = {"blocks.*.up": "colwise", "blocks.*.attn.q": "colwise", "lm": "rowwise"}
    elif case == "indivisible":
        model.blocks[0].up = nn.Linear(8, 15)
    elif case == "style":
        model.tp_plan = {"head": "diagonal"}
    try:
        accelerator.prepare(model)
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no_plan", "has no `tp_plan` / `_tp_plan`. Give the model one"),
        ("missing", "does not have: ['blocks.*.attn.q', 'lm']"),
        ("indivisible", "Linear.out_features = 15 over tp_size=2, which does not divide it"),
        ("style", "tp_plan['head'] = 'diagonal' is not a tensor-parallel style"),
    ],
)
def test_bad_plans_are_refused(case: str, expected: str) -> None:
    for message in run_distributed(_bad, case, world_size=2, timeout=90):
        assert expected in message


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))


def _resume(tp_size: int, folder: str, save: bool) -> dict[str, Any]:
    """Train 2 steps and save (``save``), or load; then report one more step's loss."""
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig

    torch.manual_seed(0 if save else 1)  # a loaded run starts from other weights
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    config = ParallelismConfig(tp_size=tp_size) if tp_size > 1 else None
    accelerator = Accelerator(parallelism_config=config)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = [ids for ids, _ in _batches()]
    if save:
        for ids in batches[:2]:
            accelerator.backward(_loss(model, ids))
            optimizer.step()
            optimizer.zero_grad()
        accelerator.save_state(folder)
    else:
        accelerator.load_state(folder)
    loss = _loss(model, batches[2])
    accelerator.backward(loss)
    optimizer.step()
    from hasten.checkpointing.layouts.factory import checkpoint_layout

    layout = type(checkpoint_layout(accelerator.strategy)).__name__
    return {"loss": loss.item(), "layout": layout}


@pytest.mark.timeout(240)
def test_tensor_parallel_checkpoint_resumes_on_the_same_and_another_mesh(tmp_path: Any) -> None:
    folder = str(tmp_path / "ckpt")
    saved = run_distributed(_resume, 2, folder, True, world_size=2, timeout=150)
    assert saved[0]["layout"] == "ShardedLayout"
    assert (tmp_path / "ckpt").is_dir()
    same = run_distributed(_resume, 2, folder, False, world_size=2, timeout=150)
    assert [r["loss"] for r in same] == [r["loss"] for r in saved]  # exact on the same mesh
    from hasten.state._shared import reset_state

    reset_state()
    single = _resume(1, folder, False)  # tp 2 -> one process without tensor parallelism
    assert single["loss"] == pytest.approx(saved[0]["loss"], rel=1e-5)


def _pre_sharded(tp_matches: bool) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig
    from hasten.utils import get_model_tp_size, model_has_dtensor

    torch.manual_seed(0)
    model = TinyLM()
    plain_size = get_model_tp_size(model)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    if not tp_matches:  # transformers records the degree it sharded with in `_tp_size`
        model._tp_size = 4  # type: ignore[assignment]
    parallelize_module(model, mesh, {"blocks.0.up": ColwiseParallel()})  # sharded by the user
    before = model.blocks[0].up.weight
    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    try:
        prepared = accelerator.prepare(model)
    except ValueError as error:
        return {"error": str(error)}
    return {
        "plain_size": plain_size,
        "has_dtensor": model_has_dtensor(prepared),
        "size": get_model_tp_size(prepared),
        "unchanged": prepared.blocks[0].up.weight is before,
        "down_plain": not model_has_dtensor(prepared.blocks[0].down),
    }


@pytest.mark.timeout(120)
def test_pre_sharded_models_are_accepted_unchanged() -> None:
    for result in run_distributed(_pre_sharded, True, world_size=2, timeout=90):
        assert result == {
            "plain_size": None,
            "has_dtensor": True,
            "size": 2,
            "unchanged": True,
            "down_plain": True,  # the user's plan is kept; hasten adds nothing
        }
    for result in run_distributed(_pre_sharded, False, world_size=2, timeout=90):
        assert "already sharded with tensor-parallel degree 4" in result["error"]
        assert "tp_size=2" in result["error"]


def _accumulate(tp_size: int) -> list[list[float]]:
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig

    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(tp_size=tp_size) if tp_size > 1 else None,
        gradient_accumulation_steps=2,
        mixed_precision="bf16",
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    for ids, _ in _batches() * 2:
        with accelerator.accumulate(model):
            accelerator.backward(_loss(model, ids))
            optimizer.step()
            optimizer.zero_grad()
    return accelerator.get_state_dict(model)["head.weight"].tolist()


@pytest.mark.timeout(180)
def test_tensor_parallel_with_accumulation_and_bf16_matches_one_process() -> None:
    reference = _accumulate(1)
    from hasten.state._shared import reset_state

    reset_state()
    for weights in run_distributed(_accumulate, 2, world_size=2, timeout=150):
        torch.testing.assert_close(
            torch.tensor(weights), torch.tensor(reference), rtol=2e-2, atol=2e-3
        )

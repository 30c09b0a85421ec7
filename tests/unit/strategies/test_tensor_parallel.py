"""strategies.tensor_parallel on one process: plan resolution, styles, errors, mixed clipping."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from _support.tp_models import TinyLM
from hasten.strategies.tensor_parallel import (
    clip_mixed_grad_norm_,
    find_tp_plan,
    get_model_tp_size,
    model_has_dtensor,
    resolve_tp_plan,
)


def test_patterns_resolve_to_every_matching_module_with_its_style() -> None:
    plan = {
        "embed": "rowwise",
        "blocks.*.up": "colwise",
        "blocks.*.down": "rowwise_rep",
        "blocks.*.norm": "sequence_parallel",
        "head": "colwise_rep",
    }
    resolved = resolve_tp_plan(TinyLM(), plan, 2)
    assert sorted(resolved) == sorted(
        ["embed", "head"]
        + [f"blocks.{i}.{name}" for i in (0, 1) for name in ("up", "down", "norm")]
    )
    assert isinstance(resolved["blocks.1.up"], ColwiseParallel)
    assert isinstance(resolved["blocks.0.norm"], SequenceParallel)
    # an embedding's token ids and a "_rep" input are replicated, a colwise_rep output gathered
    assert resolved["embed"].input_layouts == (Replicate(),)
    assert resolved["blocks.0.down"].input_layouts == (Replicate(),)
    assert resolved["head"].output_layouts == (Replicate(),)
    style = RowwiseParallel()
    assert resolve_tp_plan(TinyLM(), {"head": style}, 2) == {"head": style}


def test_a_star_matches_one_name_segment_only() -> None:
    with pytest.raises(ValueError, match=r"does not have: \['\*\.up'\]"):
        resolve_tp_plan(TinyLM(), {"*.up": "colwise"}, 2)  # up sits two segments deep


@pytest.mark.parametrize(
    ("plan", "tp_size", "match"),
    [
        ({"head": "colwise"}, 3, r"Linear.out_features = 16 over tp_size=3"),
        ({"blocks.0.down": "rowwise"}, 3, r"Linear.in_features = 16 over tp_size=3"),
        ({"embed": "rowwise"}, 3, r"Embedding.num_embeddings = 16 over tp_size=3"),
        ({"embed": "colwise"}, 3, r"Embedding.embedding_dim = 8 over tp_size=3"),
        ({"head": "local_colwise"}, 2, r"'local_colwise' is not a tensor-parallel style"),
        ({"lm_head": "colwise", "head": "colwise"}, 2, r"does not have: \['lm_head'\]"),
    ],
)
def test_plans_that_do_not_fit_are_refused(plan: dict, tp_size: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_tp_plan(TinyLM(), plan, tp_size)


def test_the_plan_and_sizes_are_found_on_the_model() -> None:
    model = TinyLM()
    assert find_tp_plan(model) == TinyLM.tp_plan
    plain = nn.Linear(2, 2)
    assert find_tp_plan(plain) is None
    plain._tp_plan = {"": "colwise"}  # type: ignore[assignment]
    assert find_tp_plan(plain) == {"": "colwise"}
    assert get_model_tp_size(model) is None and not model_has_dtensor(model)


def test_tp_size_recorded_by_transformers_4_and_5() -> None:
    from types import SimpleNamespace

    model = nn.Linear(2, 2)
    model.tp_size = 2  # type: ignore[assignment]  # transformers < 5: on the model
    assert get_model_tp_size(model) == 2
    model.tp_size = None  # type: ignore[assignment]  # transformers >= 5: a None stub ...
    model.config = SimpleNamespace(distributed_config=SimpleNamespace(tp_size=4))  # type: ignore[assignment]
    assert get_model_tp_size(model) == 4  # ... and the degree in the config
    model.config = SimpleNamespace(distributed_config={"tp_size": 8})  # type: ignore[assignment]
    assert get_model_tp_size(model) == 8  # a config read back from JSON


def test_mixed_clipping_of_plain_gradients_matches_torch() -> None:
    torch.manual_seed(0)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.load_state_dict(first.state_dict())
    for model in (first, second):
        model(torch.randn(3, 4, generator=torch.Generator().manual_seed(1))).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(first.parameters(), 0.1)
    assert torch.allclose(clip_mixed_grad_norm_(second.parameters(), 0.1), expected)
    for a, b in zip(first.parameters(), second.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert float(clip_mixed_grad_norm_(nn.Linear(2, 2).parameters(), 1.0)) == 0.0

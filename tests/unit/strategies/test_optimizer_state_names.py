"""Optimizer states keyed by parameter name <-> torch's numbered format (resharded resumes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.checkpointing.rng import has_saved_rng_state
from hasten.strategies.sharded import by_name, by_position, keyed_by_name


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def _named_in_another_order(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """What FSDP1 with flat parameters saves: names, its unit order, one step per unit."""
    names = [n for n, _ in model.named_parameters()]
    order = names[4:] + names[:4]  # the last unit first, as a root flat parameter comes first
    step = torch.tensor(7.0)
    state = {}
    for name, param in model.named_parameters():
        entry = dict(optimizer.state[param])
        state[name] = {**entry, "step": step}  # one tensor object under every parameter
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return {"state": {n: state[n] for n in order}, "param_groups": [{**group, "params": order}]}


def test_a_named_state_in_another_order_loads_by_name_with_its_own_step_tensors() -> None:
    model, optimizer = _trained()
    saved = _named_in_another_order(model, optimizer)
    assert keyed_by_name(saved) and not keyed_by_name(optimizer.state_dict())
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fresh.load_state_dict(by_position(model, fresh, saved))
    for name, param in model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(fresh.state[param][key], saved["state"][name][key]), name
    steps = [fresh.state[p]["step"] for p in model.parameters()]
    assert len({id(s) for s in steps}) == len(steps)  # the shared step was copied for each
    model(torch.randn(2, 3)).sum().backward()
    fresh.step()  # each counts its own steps (a shared tensor would count once per parameter)
    assert all(float(s) == 8.0 for s in steps)


def test_a_named_state_of_other_parameter_groups_is_refused() -> None:
    model, optimizer = _trained()
    saved = _named_in_another_order(model, optimizer)
    weights = [p for p in model.parameters() if p.dim() > 1]
    others = [p for p in model.parameters() if p.dim() <= 1]
    two_groups = torch.optim.AdamW([{"params": weights}, {"params": others}])
    with pytest.raises(ValueError, match=r"names 6 parameters in 1 group\(s\).*2 group\(s\)"):
        by_position(model, two_groups, saved)


def test_a_numbered_state_is_named_after_the_parameters_the_optimizer_was_built_on() -> None:
    model, optimizer = _trained()
    numbered = optimizer.state_dict()
    names = [n for n, _ in model.named_parameters()]
    # an optimizer that now holds one (flat) parameter, built on the model's six
    flat = torch.optim.AdamW([nn.Parameter(torch.zeros(29))])
    renamed = by_name(model, flat, numbered, held=names)
    assert renamed["param_groups"][0]["params"] == names
    assert torch.equal(renamed["state"]["2.bias"]["exp_avg"], numbered["state"][5]["exp_avg"])
    with pytest.raises(ValueError, match="holds 6 parameters but this optimizer holds 1"):
        by_name(model, flat, numbered)


def test_processes_beyond_the_saved_ones_have_no_rng_states() -> None:
    assert has_saved_rng_state({"num_processes": 2}, 1)
    assert has_saved_rng_state({}, 5)  # not recorded (written by Accelerate)
    assert has_saved_rng_state(None, 5)  # loaded without a manifest (strict=False)
    with pytest.warns(RuntimeWarning, match=r"saved by 1 process\(es\), so process 1 has no"):
        assert not has_saved_rng_state({"num_processes": 1}, 1)

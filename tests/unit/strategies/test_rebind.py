"""rebind_optimizers: optimizers follow replaced parameters by name, with a count check."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.precision import Precision
from hasten.strategies.base import set_up_models
from hasten.strategies.call import PrepareCall, Prepared
from hasten.strategies.rebind import canonical_name, parameter_ids, rebind_optimizers


def _named(module: nn.Module) -> dict[str, nn.Parameter]:
    return {canonical_name(n): p for n, p in module.named_parameters()}


def test_canonical_name_drops_wrapper_pieces() -> None:
    assert canonical_name("a._fsdp_wrapped_module.b._checkpoint_wrapped_module.w") == "a.b.w"
    assert canonical_name("_orig_mod.layer.weight") == "layer.weight"


def test_rebind_follows_names_not_positions() -> None:
    old = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    new = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    # the optimizer lists the parameters in another order than the model
    opt = torch.optim.SGD(list(old.parameters())[::-1], lr=0.1)
    rebind_optimizers([opt], [parameter_ids(old)], [_named(new)])
    assert opt.param_groups[0]["params"] == list(new.parameters())[::-1]


def test_rebind_moves_existing_state_when_the_layout_is_unchanged() -> None:
    old, new = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.SGD(old.parameters(), lr=0.1, momentum=0.9)
    old(torch.ones(1, 2)).sum().backward()
    opt.step()
    rebind_optimizers([opt], [parameter_ids(old)], [_named(new)])
    assert set(opt.state) == set(new.parameters())


def test_a_parameter_that_vanished_is_an_error() -> None:
    old, new = nn.Linear(2, 2), nn.Linear(2, 2, bias=False)
    opt = torch.optim.SGD(old.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"1 parameter\(s\) that no longer exist.*first: bias"):
        rebind_optimizers([opt], [parameter_ids(old)], [_named(new)])


def test_merged_parameters_are_an_error() -> None:
    old = nn.Linear(2, 2)
    flat = nn.Parameter(torch.zeros(6))
    opt = torch.optim.SGD(old.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="held 2 parameters but 1 remain"):
        rebind_optimizers([opt], [parameter_ids(old)], [{"weight": flat, "bias": flat}])


def test_state_that_cannot_follow_a_new_layout_is_an_error() -> None:
    old = nn.Linear(2, 2)
    opt = torch.optim.SGD(old.parameters(), lr=0.1, momentum=0.9)
    old(torch.ones(1, 2)).sum().backward()
    opt.step()

    class Other(nn.Parameter):
        pass

    after = {n: Other(p.detach().clone()) for n, p in _named(old).items()}
    with pytest.raises(ValueError, match="already has state"):
        rebind_optimizers([opt], [parameter_ids(old)], [after])


def test_setup_holds_no_reference_to_the_parameters_it_replaces() -> None:
    import gc
    import weakref

    from hasten.strategies import SingleDeviceStrategy

    model = nn.Linear(2, 2)
    old = weakref.ref(model.weight)
    freed: list[bool] = []

    def shard(module: nn.Module, index: int) -> nn.Module:
        module.weight = nn.Parameter(torch.zeros(2, 2))  # what sharding does to every weight
        gc.collect()
        freed.append(old() is None)  # the unsharded weight can go while the rest is set up
        return module

    class Sharding(SingleDeviceStrategy):
        def setup(self, call: PrepareCall) -> Prepared:
            return set_up_models(self, call, list(call.objects), shard)

    call = PrepareCall(
        objects=(model,),
        kinds=("model",),
        placements=(False,),
        device=torch.device("cpu"),
        precision=Precision(),
    )
    Sharding().setup(call)
    assert freed == [True]

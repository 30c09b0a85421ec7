from __future__ import annotations

from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import torch
from torch import nn

from hasten.strategies.compile import (
    compile_model,
    compile_regions,
    compile_regions_in_place,
    repeated_blocks,
)
from hasten.strategies.unwrap import is_compiled_module


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + x


class Tower(nn.Module):
    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@dataclass
class Plugin:
    backend: Any = "EAGER"
    use_regional_compilation: bool = False
    disable: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_kwargs(self) -> dict[str, Any]:
        return {"backend": self.backend, **self.extra}


def test_repeated_blocks_found_and_mixed_lists_skipped() -> None:
    tower = Tower()
    assert repeated_blocks(tower) == list(tower.blocks)
    mixed = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert repeated_blocks(mixed) == []


def test_compile_regions_in_place_keeps_names() -> None:
    torch._dynamo.reset()
    tower = Tower()
    names = [n for n, _ in tower.named_parameters()]
    x = torch.randn(2, 4)
    expected = tower(x)
    out = compile_regions_in_place(tower, backend="eager")
    assert out is tower
    assert [n for n, _ in out.named_parameters()] == names
    assert all(b._compiled_call_impl is not None for b in tower.blocks)
    torch.testing.assert_close(out(x), expected)


def test_compile_regions_in_place_without_blocks_wraps_or_compiles_in_place() -> None:
    assert is_compiled_module(compile_regions_in_place(nn.Linear(2, 2), backend="eager"))
    lin = nn.Linear(2, 2)
    assert compile_regions_in_place(lin, wrap_whole=False, backend="eager") is lin
    assert lin._compiled_call_impl is not None


def test_compile_regions_deepspeed_never_wraps() -> None:
    from hasten.utils import compile_regions_deepspeed

    tower, lin = Tower(), nn.Linear(2, 2)
    compile_regions_deepspeed(tower, backend="eager")
    assert all(b._compiled_call_impl is not None for b in tower.blocks)
    assert tower._compiled_call_impl is None
    compile_regions_deepspeed(lin, backend="eager")
    assert lin._compiled_call_impl is not None


def test_compile_regions_returns_a_compiled_copy_and_leaves_the_original_alone() -> None:
    torch._dynamo.reset()
    tower = Tower()
    names = [n for n, _ in tower.named_parameters()]
    x = torch.randn(2, 4)
    expected = tower(x)
    out = compile_regions(tower, backend="eager")
    assert out is not tower and type(out) is Tower
    assert out.__dict__["_orig_mod"] is tower
    assert "_orig_mod" not in out._modules  # not a registered child: no extra state-dict entries
    assert all(is_compiled_module(b) for b in out.blocks)
    assert [b._orig_mod for b in out.blocks] == list(tower.blocks)
    assert is_compiled_module(out.inp) and out.inp._orig_mod is tower.inp  # other leaves too
    assert out.blocks is not tower.blocks and out.blocks.__dict__["_orig_mod"] is tower.blocks
    # The original: same children, nothing compiled, names unchanged.
    assert not any(is_compiled_module(m) for m in tower.modules())
    assert all(m._compiled_call_impl is None for m in tower.modules())
    assert [n for n, _ in tower.named_parameters()] == names
    # Parameters are shared, not copied.
    assert {id(p) for p in out.parameters()} == {id(p) for p in tower.parameters()}
    torch.testing.assert_close(out(x), expected)
    with torch.no_grad():
        tower.head.bias.add_(1.0)
    torch.testing.assert_close(out(x), tower(x))
    # Own containers: registering on the copy leaves the original as it was.
    out.register_buffer("extra", torch.zeros(1))
    assert "extra" not in dict(tower.named_buffers())


def test_compile_regions_rebinds_instance_bound_methods_to_the_copy() -> None:
    torch._dynamo.reset()
    tower = Tower()
    calls: list[nn.Module] = []

    def forward(self: Tower, x: torch.Tensor) -> torch.Tensor:
        calls.append(self)
        return Tower.forward(self, x)

    tower.forward = MethodType(forward, tower)  # type: ignore[method-assign]
    out = compile_regions(tower, backend="eager")
    assert out.__dict__["forward"].__self__ is out
    assert tower.__dict__["forward"].__self__ is tower
    out(torch.randn(2, 4))
    assert calls == [out]
    plain = compile_regions(Tower(), backend="eager")
    assert "forward" not in plain.__dict__


def test_compile_regions_copy_unwraps_and_saves_under_the_original_names(
    tmp_path: Any,
) -> None:
    from hasten import Accelerator
    from hasten.utils import extract_model_from_parallel, has_compiled_regions

    tower = Tower()
    names = list(tower.state_dict())
    out = compile_regions(tower, backend="eager")
    assert has_compiled_regions(out) and not has_compiled_regions(tower)
    assert all("_orig_mod." in n for n in out.state_dict())
    assert extract_model_from_parallel(out, keep_torch_compile=False) is tower
    assert extract_model_from_parallel(out) is out
    wrapped = compile_regions(nn.DataParallel(tower), backend="eager")
    assert extract_model_from_parallel(wrapped, keep_torch_compile=False) is tower
    assert extract_model_from_parallel(wrapped).__dict__["_orig_mod"] is tower

    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(out)
    assert accelerator.unwrap_model(prepared, keep_torch_compile=False) is tower
    assert list(accelerator.get_state_dict(prepared)) == names
    accelerator.save_model(prepared, tmp_path)
    from safetensors.torch import load_file

    assert sorted(load_file(tmp_path / "model.safetensors")) == sorted(names)


def test_compile_regions_shared_block_maps_to_one_wrapper() -> None:
    block = Block()
    model = nn.Sequential(nn.ModuleList([block, Block()]), nn.ModuleList([block, Block()]))
    out = compile_regions(model, backend="eager")
    assert out[0][0] is out[1][0]
    assert out[0][0]._orig_mod is block
    holder = nn.Sequential(nn.ModuleList([Block(), Block()]), nn.ModuleDict())
    assert compile_regions(holder, backend="eager")[1] is holder[1]  # nothing to compile


def test_compile_regions_fsdp2_compiles_blocks_in_place_before_sharding() -> None:
    from hasten.utils import compile_regions_fsdp2

    tower = Tower()
    names = [n for n, _ in tower.named_parameters()]
    assert compile_regions_fsdp2(tower, backend="eager") is tower  # no wrapper to shard around
    assert [n for n, _ in tower.named_parameters()] == names
    assert all(b._compiled_call_impl is not None for b in tower.blocks)
    assert tower.head._compiled_call_impl is None


def test_compile_regions_without_blocks_compiles_whole() -> None:
    lin = nn.Linear(2, 2)
    out = compile_regions(lin, backend="eager")
    assert is_compiled_module(out) and out._orig_mod is lin


def test_compile_model_follows_plugin() -> None:
    net = Tower()
    assert compile_model(net, None) is net
    assert compile_model(net, Plugin(backend="NO")) is net
    assert compile_model(net, Plugin(disable=True)) is net
    whole = compile_model(net, Plugin(extra={"mode": "default"}))
    assert is_compiled_module(whole)
    assert compile_model(whole, Plugin()) is whole
    tower = Tower()
    regional = compile_model(tower, Plugin(use_regional_compilation=True))
    assert regional is tower  # prepare's regional compilation works in place
    assert regional.blocks[0]._compiled_call_impl is not None
    copy = compile_regions(Tower(), backend="eager")
    assert compile_model(copy, Plugin(use_regional_compilation=True)) is copy  # not nested


def test_repeated_block_predicates() -> None:
    from hasten.strategies.compile import has_repeated_blocks, is_repeated_blocks

    blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    assert is_repeated_blocks(blocks)
    assert not is_repeated_blocks(nn.ModuleList())
    assert not is_repeated_blocks(nn.ModuleList([nn.Linear(2, 2), nn.ReLU()]))
    assert not is_repeated_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    assert has_repeated_blocks(nn.Sequential(nn.ReLU(), blocks))
    assert not has_repeated_blocks(nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))


def test_has_compiled_regions_sees_compiled_submodules_and_regional_compilation() -> None:
    from hasten.strategies.compile import has_compiled_regions

    model = nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]))
    assert not has_compiled_regions(model)
    assert has_compiled_regions(nn.Sequential(torch.compile(nn.Linear(2, 2))))
    compile_regions_in_place(model, backend="eager")
    assert has_compiled_regions(model)

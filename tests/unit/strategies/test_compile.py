from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hasten.strategies.compile import compile_model, compile_regions, repeated_blocks
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
    out = compile_regions(tower, backend="eager")
    assert out is tower
    assert [n for n, _ in out.named_parameters()] == names
    assert all(b._compiled_call_impl is not None for b in tower.blocks)
    torch.testing.assert_close(out(x), expected)


def test_compile_regions_fsdp2_compiles_blocks_in_place_before_sharding() -> None:
    from hasten.utils import compile_regions_fsdp2

    tower = Tower()
    names = [n for n, _ in tower.named_parameters()]
    assert compile_regions_fsdp2(tower, backend="eager") is tower  # no wrapper to shard around
    assert [n for n, _ in tower.named_parameters()] == names
    assert all(b._compiled_call_impl is not None for b in tower.blocks)
    assert tower.head._compiled_call_impl is None


def test_compile_regions_without_blocks_compiles_whole() -> None:
    out = compile_regions(nn.Linear(2, 2), backend="eager")
    assert is_compiled_module(out)


def test_compile_model_follows_plugin() -> None:
    net = Tower()
    assert compile_model(net, None) is net
    assert compile_model(net, Plugin(backend="NO")) is net
    assert compile_model(net, Plugin(disable=True)) is net
    whole = compile_model(net, Plugin(extra={"mode": "default"}))
    assert is_compiled_module(whole)
    assert compile_model(whole, Plugin()) is whole
    regional = compile_model(Tower(), Plugin(use_regional_compilation=True))
    assert not is_compiled_module(regional)
    assert regional.blocks[0]._compiled_call_impl is not None


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
    compile_regions(model, backend="eager")
    assert has_compiled_regions(model)

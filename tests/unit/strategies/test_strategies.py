from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hasten.checkpointing.layouts.dcp_shards import ShardedLayout
from hasten.checkpointing.layouts.engine import EngineLayout
from hasten.checkpointing.layouts.factory import checkpoint_layout
from hasten.config.enums import DistributedType
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.precision import Precision
from hasten.state.engine import EngineChoice
from hasten.strategies import (
    DDPStrategy,
    SingleDeviceStrategy,
    Strategy,
    UnwiredStrategy,
    select_strategy,
)
from hasten.strategies.call import PrepareCall
from hasten.strategies.composable import ComposableStrategy
from hasten.strategies.deepspeed import DeepSpeedStrategy
from hasten.strategies.fsdp1 import FSDP1Strategy


@pytest.fixture
def one_process_group() -> Iterator[None]:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


class RecordingKwargs:
    def __init__(self, **changed: Any) -> None:
        self.changed = changed
        self.hooked: list[nn.Module] = []

    def to_kwargs(self) -> dict[str, Any]:
        return dict(self.changed)

    def register_comm_hook(self, model: DistributedDataParallel) -> None:
        self.hooked.append(model)


def set_up(strategy: Strategy, model: nn.Module, device: torch.device | None) -> nn.Module:
    """``model`` through ``strategy.setup`` as ``prepare_model`` hands it over."""
    call = PrepareCall(
        objects=(model,),
        kinds=("model",),
        placements=(device is not None,),
        device=device or torch.device("cpu"),
        precision=Precision(),
        whole=False,
    )
    prepared: nn.Module = strategy.setup(call).objects[0]
    return prepared


def test_single_device_moves_and_clips() -> None:
    strategy = SingleDeviceStrategy()
    net = nn.Linear(3, 1).double()
    out = set_up(strategy, net, torch.device("cpu"))
    assert out is net
    assert set_up(strategy, net, None) is net
    net(torch.ones(2, 3, dtype=torch.float64)).sum().mul(100).backward()
    norm = strategy.clip_grad_norm_(net.parameters(), 1.0)
    assert norm > 1.0
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in net.parameters()))
    assert total == pytest.approx(1.0, rel=1e-4)
    strategy.clip_grad_value_(net.parameters(), 0.01)
    assert all(p.grad.abs().max() <= 0.01 for p in net.parameters())
    with strategy.no_sync(net), strategy.trigger_sync_in_backward(net):
        pass
    assert strategy.unwrap(net) is net
    assert not strategy.syncs_gradients
    strategy.check_usable()


def test_ddp_wraps_with_kwargs_and_hook(one_process_group: None) -> None:
    handler = RecordingKwargs(bucket_cap_mb=5, comm_hook="fp16")
    strategy = DDPStrategy(ddp_kwargs=handler)
    assert strategy.wrap_kwargs() == {"bucket_cap_mb": 5}
    net = nn.Linear(3, 1)
    wrapped = set_up(strategy, net, torch.device("cpu"))
    assert isinstance(wrapped, DistributedDataParallel)
    assert wrapped.bucket_bytes_cap == 5 * 1024 * 1024
    assert handler.hooked == [wrapped]
    assert strategy.unwrap(wrapped) is net
    with strategy.no_sync(wrapped):
        assert wrapped.require_backward_grad_sync is False
    assert wrapped.require_backward_grad_sync is True
    with strategy.no_sync(wrapped):
        wrapped(torch.ones(1, 3)).sum().backward()
        with strategy.trigger_sync_in_backward(wrapped):
            assert wrapped.require_backward_grad_sync is True
        assert wrapped.require_backward_grad_sync is False


def test_ddp_device_ids_and_frozen_model(one_process_group: None) -> None:
    assert DDPStrategy(device_ids=[1]).wrap_kwargs() == {"device_ids": [1], "output_device": 1}
    frozen = nn.Linear(2, 2).requires_grad_(False)
    strategy = DDPStrategy()
    assert set_up(strategy, frozen, None) is frozen
    with strategy.no_sync(frozen):
        pass


def test_select_maps_types_to_strategies() -> None:
    cpu = torch.device("cpu")
    assert isinstance(select_strategy(DistributedType.NO, device=cpu), SingleDeviceStrategy)
    ddp = select_strategy(DistributedType.MULTI_CPU, device=cpu)
    assert isinstance(ddp, DDPStrategy)
    assert ddp.device_ids is None
    gpu = select_strategy("MULTI_GPU", device=torch.device("cuda", 1))
    assert isinstance(gpu, DDPStrategy)
    assert gpu.device_ids == [1]
    fsdp = select_strategy(DistributedType.FSDP, device=cpu)  # the default plugin's version
    assert isinstance(fsdp, (FSDP1Strategy, ComposableStrategy)) and fsdp.shards_parameters
    plugin2 = FullyShardedDataParallelPlugin(fsdp_version=2)
    chosen = select_strategy(EngineChoice("fsdp", DistributedType.FSDP, plugin2), device=cpu)
    assert isinstance(chosen, ComposableStrategy)
    assert isinstance(checkpoint_layout(chosen), ShardedLayout)
    # A DeepSpeed request this run cannot honour is refused, never silently ignored.
    choice = EngineChoice("none", DistributedType.MULTI_CPU, requested=("deepspeed",))
    plugin = select_strategy(choice, device=cpu)
    assert isinstance(plugin, UnwiredStrategy)
    assert plugin.engine == "DeepSpeed"
    deepspeed = EngineChoice("deepspeed", DistributedType.DEEPSPEED, deepspeed_plugins=object())
    strategy = select_strategy(deepspeed, device=cpu)
    assert isinstance(strategy, DeepSpeedStrategy)
    assert strategy.backend == "gloo" and isinstance(checkpoint_layout(strategy), EngineLayout)
    # A single process with an FSDP plugin has nothing to shard (Accelerate's behaviour).
    single = EngineChoice("none", DistributedType.NO, requested=("fsdp",))
    assert isinstance(select_strategy(single, device=cpu), SingleDeviceStrategy)


def test_select_rejects_unknown_type() -> None:
    with pytest.raises(ValueError, match="Unknown distributed_type 'MULTI_TOASTER'"):
        select_strategy("MULTI_TOASTER", device=torch.device("cpu"))


def test_unwired_strategy_refuses_clearly() -> None:
    strategy = UnwiredStrategy("Megatron-LM")
    with pytest.raises(NotImplementedError, match="Megatron-LM engine is not wired"):
        strategy.check_usable()
    with pytest.raises(NotImplementedError, match="Remove the Megatron-LM plugin"):
        set_up(strategy, nn.Linear(1, 1), None)
    assert "Megatron-LM" in repr(strategy)
    assert isinstance(strategy, Strategy)


def test_parallelism_beyond_ddp_is_unwired() -> None:
    class Config:
        dp_shard_enabled = True
        non_dp_dim_names = ["tp"]

    strategy = select_strategy("MULTI_CPU", device=torch.device("cpu"), parallelism_config=Config())
    assert isinstance(strategy, UnwiredStrategy)
    assert strategy.engine == "composable parallelism (dp_shard, tp)"

    class PlainDDP:
        dp_shard_enabled = False
        non_dp_dim_names: list[str] = []

    plain = select_strategy("MULTI_CPU", device=torch.device("cpu"), parallelism_config=PlainDDP())
    assert isinstance(plain, DDPStrategy)


def test_join_is_a_noop_without_ddp_and_join_under_ddp(one_process_group: None) -> None:
    from torch.distributed.algorithms.join import Join

    with SingleDeviceStrategy().join([]) as ctx:
        assert ctx is None
    wrapped = set_up(DDPStrategy(), nn.Linear(2, 1), None)
    assert isinstance(DDPStrategy().join([wrapped]), Join)

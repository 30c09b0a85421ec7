"""`parallelize` applies a plan's steps in the one written order, each only when asked.

The order is recorded on one process: each ``apply_*`` step is replaced by a recorder (the
meshes are stand-ins), so no process group is needed. The plan flags are tested for real where
one process can run them (activation checkpointing with tensor parallelism alone, DDP).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.contract import _get_registry
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.nn.parallel import DistributedDataParallel

from _support.fsdp_models import TinyTransformer
from hasten.config.dynamo import TorchDynamoPlugin
from hasten.precision import Precision
from hasten.strategies import parallelize as steps
from hasten.strategies.parallelize import ParallelPlan, parallelize
from hasten.strategies.settings import DDPSettings, FSDPSettings, WrapSettings

CPU = torch.device("cpu")
MESH = cast(DeviceMesh, object())  # a stand-in: the recorded steps never use it
BLOCKS = WrapSettings(policy=transformer_auto_wrap_policy, class_names=("Block",))


class _RecordingPrecision(Precision):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def wrap_forward(self, model: nn.Module) -> None:
        self.log.append("precision")


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the steps `parallelize` runs, in order (each step only records)."""
    order: list[str] = []

    def record(name: str, result: Any = None) -> Any:
        def step(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
            order.append(name)
            return model if result is None else result

        return step

    monkeypatch.setattr(steps, "apply_placement", lambda m, d, **kw: order.append("place"))
    for name in ("apply_tp", "apply_ac", "apply_ddp", "apply_compile", "apply_fsdp"):
        monkeypatch.setattr(steps, name, record(name.removeprefix("apply_")))
    monkeypatch.setattr(steps, "broadcast_from_rank0", record("broadcast"))
    return order


def test_tp_ac_compile_fsdp_run_in_the_written_order(log: list[str]) -> None:
    plan = ParallelPlan(
        device=CPU,
        tp_mesh=MESH,
        checkpoint=BLOCKS,
        precision=_RecordingPrecision(log),
        dynamo=TorchDynamoPlugin(backend="eager"),
        fsdp=FSDPSettings(wrap=BLOCKS),
        fsdp_mesh=MESH,
    )
    parallelize(TinyTransformer(), plan)
    assert log == ["place", "tp", "ac", "precision", "compile", "fsdp"]


def test_ddp_wraps_after_autocast_and_before_compile(log: list[str]) -> None:
    plan = ParallelPlan(device=CPU, precision=_RecordingPrecision(log), ddp=DDPSettings())
    parallelize(TinyTransformer(), plan)
    assert log == ["place", "precision", "ddp", "compile"]


def test_tensor_parallelism_alone_can_checkpoint_activations(log: list[str]) -> None:
    plan = ParallelPlan(tp_mesh=MESH, checkpoint=BLOCKS, precision=_RecordingPrecision(log))
    parallelize(TinyTransformer(), plan)
    assert log == ["place", "tp", "ac", "precision", "compile"]


def test_an_empty_plan_only_places_autocasts_and_compiles(log: list[str]) -> None:
    parallelize(TinyTransformer(), ParallelPlan(precision=_RecordingPrecision(log)))
    assert log == ["place", "precision", "compile"]


def test_rank0_weights_fill_the_shards_after_fsdp(
    log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = object()

    def place(model: nn.Module, device: torch.device | None, *, to_meta: bool = False) -> Any:
        log.append(f"place(to_meta={to_meta})")
        return kept

    monkeypatch.setattr(steps, "apply_placement", place)
    plan = ParallelPlan(
        device=CPU,
        precision=_RecordingPrecision(log),
        fsdp=FSDPSettings(from_rank0=True),
        fsdp_mesh=MESH,
    )
    parallelize(TinyTransformer(), plan)
    assert log == ["place(to_meta=True)", "precision", "compile", "fsdp", "broadcast"]


def test_activation_checkpointing_without_fsdp_checkpoints_the_blocks() -> None:
    model = TinyTransformer()
    reference = TinyTransformer()
    reference.load_state_dict(model.state_dict())
    prepared = parallelize(model, ParallelPlan(checkpoint=BLOCKS))
    assert prepared is model
    assert all("checkpoint" in (_get_registry(b) or {}) for b in model.layers)
    assert _get_registry(model.head) is None and _get_registry(model) is None
    x = torch.randn(3, 8)
    prepared(x).sum().backward()
    reference(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.grad is not None and torch.allclose(p.grad, q.grad), name  # type: ignore[arg-type]


@pytest.fixture
def one_process_group() -> Iterator[None]:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_the_ddp_step_wraps_and_installs_the_hook(one_process_group: None) -> None:
    hooked: list[nn.Module] = []
    settings = DDPSettings(kwargs={"bucket_cap_mb": 5}, comm_hook=hooked.append)
    wrapped = parallelize(nn.Linear(3, 1), ParallelPlan(device=CPU, ddp=settings))
    assert isinstance(wrapped, DistributedDataParallel)
    assert wrapped.bucket_bytes_cap == 5 * 1024 * 1024 and hooked == [wrapped]
    frozen = nn.Linear(2, 2).requires_grad_(False)
    assert parallelize(frozen, ParallelPlan(ddp=DDPSettings())) is frozen


def test_a_plan_refuses_fsdp_without_its_mesh_and_ddp_with_sharding() -> None:
    with pytest.raises(ValueError, match="needs fsdp and fsdp_mesh together.*Give both"):
        ParallelPlan(fsdp=FSDPSettings())
    with pytest.raises(ValueError, match="needs fsdp and fsdp_mesh together"):
        ParallelPlan(fsdp_mesh=MESH)
    with pytest.raises(ValueError, match="cannot be combined with fsdp or tp_mesh"):
        ParallelPlan(ddp=DDPSettings(), tp_mesh=MESH)


def test_wrap_settings_bind_without_a_plugin() -> None:
    model = TinyTransformer()
    assert WrapSettings().bind(model) is None
    by_name = WrapSettings(policy=transformer_auto_wrap_policy)  # the model's _no_split_modules
    bound = by_name.bind(model)
    assert bound is not None and bound(module=model.layers[0], recurse=False, nonwrapped_numel=0)
    with pytest.raises(ValueError, match="'Nope'.*classes present"):
        WrapSettings(policy=transformer_auto_wrap_policy, class_names=("Nope",)).bind(model)


def test_the_composable_strategy_answers_from_its_plugin_not_its_instance() -> None:
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.strategies.composable import ComposableStrategy

    strategy = ComposableStrategy(FullyShardedDataParallelPlugin(fsdp_version=2), CPU)
    assert (strategy.name, strategy.syncs_gradients, strategy.full_offload) == ("fsdp2", True, True)
    assert not {"name", "syncs_gradients", "full_offload"} & set(vars(strategy))

"""The composable strategy: FSDP2, tensor parallelism, HSDP and FSDP2 x TP on the job's mesh.

Each prepared model is placed (on the device, or on meta with ``cpu_ram_efficient_loading``),
then `strategies.parallelize` applies the parallelisms in their one written order over the
sub-meshes of the job's `DeviceMesh`: ``tp`` for tensor parallelism, and for ``fully_shard``
``dp_shard`` (``dp_shard_cp`` with context parallelism), with ``dp_replicate`` in front for HSDP.
A run without a `ParallelismConfig` shards over a 1-D mesh of every process. With
``cpu_ram_efficient_loading`` rank 0 keeps the real weights while every process shards an empty
(meta) copy, and the weights are broadcast from rank 0 into the shards afterwards: the other
ranks may pass a model built on meta (``init_empty_weights``) and never hold more than their
shard and one broadcast tensor. Optimizers built on the user's model are rebound to the DTensor
parameters by name afterwards (`Strategy.setup`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import override

from hasten.precision import Precision
from hasten.state.mesh import submesh
from hasten.strategies.call import PrepareCall
from hasten.strategies.compile import CompileSettings
from hasten.strategies.fsdp_plugin import fsdp_settings, resolve_offload
from hasten.strategies.parallelize import ParallelPlan, parallelize
from hasten.strategies.sharded import ShardedStrategy, saves_shards, tied_parameter_names
from hasten.strategies.tensor_parallel import clip_mixed_grad_norm_

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.parallelism import ParallelismConfig

__all__ = ["ComposableStrategy", "fsdp_mesh"]


def fsdp_mesh(mesh: DeviceMesh, config: ParallelismConfig) -> DeviceMesh:
    """The sub-mesh FSDP2 shards over: ``dp_shard`` (``dp_shard_cp`` with context parallelism),
    with ``dp_replicate`` in front for HSDP.

    Raises:
        ValueError: the mesh has no dimension to shard over.
    """
    shard = "dp_shard_cp" if config.cp_enabled else "dp_shard"
    if submesh(mesh, shard) is None:
        raise ValueError(
            "FSDP2 on a ParallelismConfig mesh needs dp_shard_size > 1 (or cp_size > 1) to "
            f"shard over; the mesh has {mesh.mesh_dim_names}"
        )
    if not config.dp_replicate_enabled:
        return submesh(mesh, shard)  # type: ignore[return-value]
    return mesh["dp_replicate", shard]


def _refuse_meta(module: nn.Module) -> None:
    meta = [name for name, p in module.named_parameters() if p.is_meta]
    if meta:
        raise ValueError(
            f"The model has {len(meta)} parameter(s) on the meta device (first: {meta[0]}), and "
            "FSDP without cpu_ram_efficient_loading needs real weights on every process. Set "
            "cpu_ram_efficient_loading=True (FSDP_CPU_RAM_EFFICIENT_LOADING=true) to broadcast "
            "the main process's weights, or build the real model on every process."
        )


class ComposableStrategy(ShardedStrategy):
    """FSDP2 and/or tensor parallelism on the job's device mesh, one `parallelize` per model.

    Args:
        plugin: the FSDP plugin (``fsdp_version=2``); None for tensor parallelism alone.
        device: this process's device.
        mesh: the job's mesh (`AcceleratorState.device_mesh`, built from ``config``); None: a
            1-D mesh of every process, built when the first model is prepared.
        config: the `ParallelismConfig` that built ``mesh``.

    Raises:
        ValueError: neither FSDP nor tensor parallelism is asked for, or
            ``cpu_ram_efficient_loading`` with tensor parallelism.
    """

    def __init__(
        self,
        plugin: FullyShardedDataParallelPlugin | None,
        device: torch.device,
        mesh: DeviceMesh | None = None,
        config: ParallelismConfig | None = None,
    ) -> None:
        super().__init__(device, saves_shards(plugin))
        self.plugin = plugin
        self.mesh = mesh
        self.config = config
        self.tensor_parallel = bool(config is not None and config.tp_enabled)
        if self.tensor_parallel and submesh(mesh, "tp") is None:
            dims = mesh.mesh_dim_names if mesh is not None else None
            raise ValueError(
                f"tensor parallelism needs the job's mesh with a 'tp' dimension; got {dims}. "
                "Build it from the ParallelismConfig (AcceleratorState does)."
            )
        if plugin is None and not self.tensor_parallel:
            raise ValueError(
                "ComposableStrategy needs an FSDP plugin (fsdp_version=2) or a ParallelismConfig "
                "with tp_size > 1"
            )
        # Tensor parallelism alone: full state dicts on every process, and the per-step
        # behaviour of a replicated run (gradients of a replica are complete after backward).
        # Its parameters are still split: full checkpoints load through the engine.
        self.fsdp = fsdp_settings(plugin) if plugin is not None else None
        if self.tensor_parallel and plugin is not None and plugin.cpu_ram_efficient_loading:
            raise ValueError(
                "cpu_ram_efficient_loading with tp_size > 1 is not supported: the tensor-parallel "
                "plan is applied to real weights before FSDP2 shards them. Set "
                "cpu_ram_efficient_loading=False (FSDP_CPU_RAM_EFFICIENT_LOADING=false)."
            )

    @property
    @override
    def name(self) -> str:  # type: ignore[override]
        return "fsdp2" if self.plugin is not None else "tensor_parallel"

    @property
    @override
    def syncs_gradients(self) -> bool:  # type: ignore[override]
        return self.plugin is not None

    @property
    @override
    def full_offload(self) -> bool:  # type: ignore[override]
        return self.plugin is not None

    @override
    def check_usable(self) -> None:
        if self.plugin is None:
            return
        resolve_offload(self.plugin)
        if self.plugin.activation_checkpointing_offload and self.device.type != "cpu":
            raise ValueError(
                "activation_checkpointing_offload is not wired in hasten's FSDP2 strategy yet; "
                "set activation_checkpointing_offload=False (activation_checkpointing=True still "
                "recomputes activations)."
            )

    def plan(
        self, precision: Precision, dynamo: CompileSettings | None, device: torch.device | None
    ) -> ParallelPlan:
        """The `ParallelPlan` each model of this run gets (builds the 1-D mesh on first use)."""
        fsdp = self.fsdp
        activation_checkpointing = self.plugin is not None and self.plugin.activation_checkpointing
        if fsdp is not None and fsdp.from_rank0 and device is None:
            device = self.device  # the empty shards are filled on this process's device
        return ParallelPlan(
            device=device,
            tp_mesh=submesh(self.mesh, "tp") if self.tensor_parallel else None,
            checkpoint=fsdp.wrap if fsdp is not None and activation_checkpointing else None,
            precision=precision,
            dynamo=dynamo,
            fsdp=fsdp,
            fsdp_mesh=self._fsdp_mesh() if fsdp is not None else None,
        )

    def _fsdp_mesh(self) -> DeviceMesh:
        if self.mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            world = dist.get_world_size()
            self.mesh = init_device_mesh(self.device.type, (world,), mesh_dim_names=("dp_shard",))
        if self.config is None:
            return self.mesh
        return fsdp_mesh(self.mesh, self.config)

    @override
    def parallel_plan(self, model: nn.Module, call: PrepareCall, index: int) -> ParallelPlan:
        """The run's plan for ``model`` (see `read_model`)."""
        self.read_model(model)
        return self.plan(call.precision, call.dynamo, call.device_of(index))

    def read_model(self, model: nn.Module) -> None:
        """Read ``model`` before it is parallelized: its tied parameter names are kept for
        saving, and a model on meta is refused unless rank 0's weights fill it.

        Raises:
            ValueError: a model on meta under FSDP2 without ``cpu_ram_efficient_loading``.
        """
        self.check_usable()
        ties = tied_parameter_names(model)
        if self.fsdp is not None and not self.fsdp.from_rank0:
            _refuse_meta(model)
        self._record_ties(model, ties)

    def shard(
        self,
        model: nn.Module,
        device: torch.device | None,
        *,
        precision: Precision,
        dynamo: CompileSettings | None = None,
    ) -> nn.Module:
        """One model through `parallelize` outside a prepare call (``fsdp2_prepare_model``)."""
        self.read_model(model)
        return parallelize(model, self.plan(precision, dynamo, device))

    @override
    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[None]:
        return _gradient_sync_off(self._module(module))

    @override
    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the global norm; on a ParallelismConfig mesh the gradients may live on several
        meshes (dp only, dp x tp, or plain tensors outside a tensor-parallel plan)."""
        if self.config is not None:
            return clip_mixed_grad_norm_(parameters, max_norm, norm_type)
        return super().clip_grad_norm_(parameters, max_norm, norm_type)

    @override
    def __repr__(self) -> str:
        mesh = self.mesh.mesh_dim_names if self.mesh is not None else None
        reshard = self.plugin.reshard_after_forward if self.plugin is not None else None
        return (
            f"ComposableStrategy(mesh={mesh}, tp={self.tensor_parallel}, "
            f"fsdp={self.plugin is not None}, reshard_after_forward={reshard!r}, "
            f"sharded_checkpoints={self.sharded_checkpoints})"
        )


@contextlib.contextmanager
def _gradient_sync_off(module: nn.Module) -> Iterator[None]:
    setter = getattr(module, "set_requires_gradient_sync", None)
    if setter is None:
        yield
        return
    setter(False)
    try:
        yield
    finally:
        setter(True)

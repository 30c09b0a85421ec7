"""FSDP2 on the job's device mesh: HSDP (dp_replicate x dp_shard) and 2-D FSDP2 x tensor parallel.

The FSDP2 strategy shards over the whole world by default; with a `ParallelismConfig` mesh this
strategy hands ``fully_shard`` the data-parallel sub-mesh (``dp_shard``, ``dp_shard_cp`` or
``(dp_replicate, dp_shard)`` for HSDP) and, when ``tp_size > 1``, first applies the model's
tensor-parallel plan on the ``tp`` sub-mesh (the torchtitan order: TP, then FSDP).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from typing_extensions import override

from hasten.state.mesh import submesh
from hasten.strategies.fsdp2 import FSDP2Strategy
from hasten.strategies.tensor_parallel import TensorParallelStrategy, clip_mixed_grad_norm_

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MeshFSDP2Strategy", "fsdp_mesh"]


def fsdp_mesh(mesh: DeviceMesh, config: Any) -> DeviceMesh:
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


class MeshFSDP2Strategy(FSDP2Strategy):
    """FSDP2 over the data-parallel sub-mesh, after tensor parallelism on ``tp`` when asked.

    Args:
        plugin: the `FullyShardedDataParallelPlugin` (fsdp_version=2).
        device: this process's device.
        mesh: the job's `DeviceMesh` (from `AcceleratorState.device_mesh`).
        config: the `ParallelismConfig` that built it.
    """

    def __init__(self, plugin: Any, device: torch.device, mesh: DeviceMesh, config: Any) -> None:
        super().__init__(plugin, device)
        self.mesh = mesh
        self.fsdp_mesh = fsdp_mesh(mesh, config)
        self.tensor_parallel = TensorParallelStrategy(mesh) if config.tp_enabled else None
        if self.tensor_parallel is not None and plugin.cpu_ram_efficient_loading:
            raise ValueError(
                "cpu_ram_efficient_loading with tp_size > 1 is not supported: the tensor-parallel "
                "plan is applied to real weights before FSDP2 shards them. Set "
                "cpu_ram_efficient_loading=False (FSDP_CPU_RAM_EFFICIENT_LOADING=false)."
            )

    @override
    def _shard_kwargs(self) -> dict[str, Any]:
        kwargs = super()._shard_kwargs()
        kwargs["mesh"] = self.fsdp_mesh
        return kwargs

    @override
    def shard(self, module: nn.Module) -> nn.Module:
        """Tensor-parallel plan on ``tp`` (if any), then ``fully_shard`` on the dp sub-mesh."""
        if self.tensor_parallel is not None:
            self.tensor_parallel.shard(module)
        return super().shard(module)

    @override
    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip over gradients living on different meshes (dp only, dp x tp); global norm."""
        return clip_mixed_grad_norm_(parameters, max_norm, norm_type)

    @override
    def __repr__(self) -> str:
        return (
            f"MeshFSDP2Strategy(mesh={self.mesh.mesh_dim_names}, "
            f"tp={self.tensor_parallel is not None}, state_dict={self.checkpoint_layout!r})"
        )

"""N-D parallelism on real gloo processes: the mesh, the ranks, who gets which batches, metrics."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore:Slicing a flattened")]


def _tp_only(old_plugin: bool) -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig, TorchTensorParallelPlugin

    if old_plugin:  # the deprecated spelling maps onto ParallelismConfig(tp_size=2)
        plugin = TorchTensorParallelPlugin(tp_size=2)
        with pytest.warns(FutureWarning, match="TorchTensorParallelPlugin` is deprecated"):
            accelerator = Accelerator(torch_tp_plugin=plugin)
        assert plugin.torch_device_mesh is accelerator.torch_device_mesh
        assert accelerator.parallelism_config.tp_size == 2
    else:
        accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    mesh = accelerator.torch_device_mesh
    loader = accelerator.prepare(DataLoader(torch.arange(8.0), batch_size=2))
    batches = [batch.tolist() for batch in loader]
    gathered = [accelerator.gather_for_metrics(batch).tolist() for batch in loader]
    try:
        accelerator.pipeline_parallel_rank
    except NotImplementedError as error:
        pipeline = str(error)
    return {
        "dims": mesh.mesh_dim_names,
        "state_mesh": accelerator.state.device_mesh is mesh,
        "ranks": (
            accelerator.tensor_parallel_rank,
            accelerator.data_parallel_rank,
            accelerator.data_parallel_shard_rank,
            accelerator.context_parallel_rank,
        ),
        "composable": accelerator.is_composable_parallelism_enabled,
        "batches": batches,
        "gathered": gathered,
        "reduced": accelerator.reduce(torch.ones(2), reduction="sum").tolist(),
        "mean": accelerator.reduce(torch.tensor([float(accelerator.process_index)])).tolist(),
        "pipeline": pipeline,
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("old_plugin", [False, True], ids=["parallelism_config", "tp_plugin"])
def test_tensor_parallel_group_gets_the_same_batches(old_plugin: bool) -> None:
    ranks = run_distributed(_tp_only, old_plugin, world_size=2, timeout=90)
    for rank, result in enumerate(ranks):
        assert result["dims"] == ("tp",)
        assert result["state_mesh"]
        assert result["ranks"] == (rank, 0, 0, 0)
        assert result["composable"] is True
        # one data-parallel replica: both tp ranks see the whole dataset, in the same order
        assert result["batches"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
        # metrics count the replica once, not once per tp rank
        assert result["gathered"] == result["batches"]
        assert result["reduced"] == [1.0, 1.0]
        assert result["mean"] == [float(rank)]
        assert "Pipeline parallelism is not supported" in result["pipeline"]


def _replicate(config_kwargs: dict[str, int]) -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig

    accelerator = Accelerator(parallelism_config=ParallelismConfig(**config_kwargs))
    loader = accelerator.prepare(DataLoader(torch.arange(8.0), batch_size=2))
    return {
        "dims": accelerator.torch_device_mesh.mesh_dim_names,
        "dp_rank": accelerator.data_parallel_rank,
        "tp_rank": accelerator.tensor_parallel_rank,
        "batches": [batch.tolist() for batch in loader],
        "reduced": accelerator.reduce(torch.ones(1), reduction="sum").tolist(),
        "composable": accelerator.is_composable_parallelism_enabled,
        "strategy": accelerator.strategy.name,
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config_kwargs", [{}, {"dp_replicate_size": 2}])
def test_replication_splits_the_data(config_kwargs: dict[str, int]) -> None:
    ranks = run_distributed(_replicate, config_kwargs, world_size=2, timeout=90)
    for rank, result in enumerate(ranks):
        # ParallelismConfig() on 2 processes becomes pure replication, as in Accelerate
        assert result["dims"] == ("dp_replicate",)
        assert (result["dp_rank"], result["tp_rank"]) == (rank, 0)
        assert result["reduced"] == [2.0]
        assert result["composable"] is False
        assert result["strategy"] == "ddp"
    assert ranks[0]["batches"] == [[0.0, 1.0], [4.0, 5.0]]
    assert ranks[1]["batches"] == [[2.0, 3.0], [6.0, 7.0]]


def _mesh_loader(dispatch: bool) -> dict[str, Any]:
    import torch.distributed as dist

    from hasten.config.parallelism import ParallelismConfig
    from hasten.data_loader import prepare_data_loader
    from hasten.state import PartialState

    state = PartialState()
    mesh = ParallelismConfig(dp_shard_size=2, tp_size=2).build_device_mesh("cpu")
    loader = DataLoader(torch.arange(16.0), batch_size=2)
    prepared = prepare_data_loader(
        loader,
        device=state.device,
        put_on_device=True,
        dispatch_batches=dispatch,
        torch_device_mesh=mesh,
    )
    return {"rank": dist.get_rank(), "batches": [b.tolist() for b in prepared]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dispatch", [False, True])
def test_dp_shard_by_tp_mesh_splits_only_across_dp(dispatch: bool) -> None:
    ranks = run_distributed(_mesh_loader, dispatch, world_size=4, timeout=100)
    seen = [r["batches"] for r in ranks]
    # mesh (dp_shard=2, tp=2): ranks 0,1 are one tp group (dp 0), ranks 2,3 the other (dp 1)
    assert seen[0] == seen[1] and seen[2] == seen[3]
    assert seen[0] == [[0.0, 1.0], [4.0, 5.0], [8.0, 9.0], [12.0, 13.0]]
    assert seen[2] == [[2.0, 3.0], [6.0, 7.0], [10.0, 11.0], [14.0, 15.0]]


def _bad_product() -> str:
    from hasten import Accelerator
    from hasten.config.parallelism import ParallelismConfig

    try:
        Accelerator(parallelism_config=ParallelismConfig(tp_size=4))
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.timeout(120)
def test_sizes_must_multiply_to_the_world_size() -> None:
    for message in run_distributed(_bad_product, world_size=2, timeout=90):
        assert "sizes multiply to 4" in message
        assert "the job has 2 process(es)" in message

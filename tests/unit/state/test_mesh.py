"""state.mesh: the ParallelismConfig of a run, the checks before a mesh is built, mesh helpers."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from hasten.config.envvars import read_prefixed
from hasten.config.parallelism import ParallelismConfig, TorchTensorParallelPlugin
from hasten.state.mesh import (
    TP_PLUGIN_DEPRECATION,
    build_device_mesh,
    data_parallel_share,
    mesh_local_rank,
    mesh_size,
    resolve_parallelism_config,
    submesh,
)


@pytest.fixture(autouse=True)
def _no_parallelism_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in read_prefixed("PARALLELISM_CONFIG_"):
        monkeypatch.delenv(name)
    monkeypatch.delenv("ACCELERATE_USE_PARALLELISM_CONFIG", raising=False)


def test_config_from_the_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_parallelism_config(None, None) is None
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    config = resolve_parallelism_config(None, None)
    assert isinstance(config, ParallelismConfig) and config.tp_size == 2
    given = ParallelismConfig(dp_shard_size=2)
    assert resolve_parallelism_config(given, None) is given  # the script's argument wins


def test_tensor_parallel_plugin_maps_onto_tp_size_with_a_deprecation() -> None:
    plugin = TorchTensorParallelPlugin(tp_size=2)
    with pytest.warns(FutureWarning) as caught:
        config = resolve_parallelism_config(None, plugin)
    assert str(caught[0].message) == TP_PLUGIN_DEPRECATION
    assert "Please use the `ParallelismConfig` with `tp_size` instead" in TP_PLUGIN_DEPRECATION
    assert config.tp_size == 2 and config.dp_shard_size == 1
    with pytest.warns(FutureWarning):
        merged = resolve_parallelism_config(ParallelismConfig(dp_shard_size=2), plugin)
    assert (merged.dp_shard_size, merged.tp_size) == (2, 2)
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match=r"torch_tp_plugin has tp_size=2 but parallelism_config"),
    ):
        resolve_parallelism_config(ParallelismConfig(dp_shard_size=2, tp_size=4), plugin)


@pytest.mark.parametrize(
    ("tp_size", "match"),
    [(1, "must be greater than 1"), ("2", "must be an int"), (True, "must be an int")],
)
def test_tensor_parallel_plugin_validates_its_size(tp_size: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TorchTensorParallelPlugin(tp_size=tp_size)  # type: ignore[arg-type]


def _build(config: ParallelismConfig, processes: int = 2, **kwargs: object) -> object:
    return build_device_mesh(
        config,
        num_processes=processes,
        device_type=str(kwargs.pop("device_type", "cpu")),
        multi_device=processes > 1,
        **kwargs,  # type: ignore[arg-type]
    )


def test_deepspeed_takes_its_sequence_parallelism_and_builds_no_torch_mesh() -> None:
    # DeepSpeed's Ulysses groups (mpu) own the sequence dimension: no DeviceMesh is built.
    assert _build(ParallelismConfig(sp_size=2), 2, deepspeed=True) is None


@pytest.mark.parametrize(
    ("config", "kwargs", "match"),
    [
        (
            ParallelismConfig(dp_shard_size=2, tp_size=2),
            {"processes": 2, "is_fsdp2": True},
            r"sizes multiply to 4 \(dp_replicate_size=1 x dp_shard_size=2 x tp_size=2 x "
            r"cp_size=1 x sp_size=1\), but the job has 2 process\(es\)",
        ),
        (
            ParallelismConfig(dp_shard_size=1, cp_size=2),
            {"processes": 2, "is_fsdp2": True},
            r"context parallelism needs a GPU; torch's context_parallel has no sharding",
        ),
        (
            ParallelismConfig(tp_size=2),
            {"processes": 2, "deepspeed": True},
            r"ParallelismConfig\(tp_size=2\) cannot be used with DeepSpeed",
        ),
        (
            ParallelismConfig(sp_size=2),
            {"processes": 2},
            r"sp_size=2\) needs DeepSpeed",
        ),
        (
            ParallelismConfig(dp_replicate_size=2, dp_shard_size=2),
            {"processes": 4, "deepspeed": True},
            r"replicate x shard \(HSDP\) layout would be ignored",
        ),
        (
            ParallelismConfig(dp_shard_size=2),
            {"processes": 2},
            r"dp_shard_size=2\) shards parameters with FSDP2, but FSDP2 is not enabled",
        ),
    ],
)
def test_layouts_the_job_cannot_run_are_refused(
    config: ParallelismConfig, kwargs: dict[str, object], match: str
) -> None:
    processes = int(kwargs.pop("processes"))  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=match):
        _build(config, processes, **kwargs)


def test_nothing_to_lay_out_builds_no_mesh() -> None:
    assert _build(None, 1) is None  # type: ignore[arg-type]
    assert _build(ParallelismConfig(), 1) is None


@pytest.fixture
def fake_group() -> Iterator[None]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=3, world_size=4, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_mesh_helpers_read_real_and_flattened_dims(fake_group: None) -> None:
    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    mesh = _build(config, 4, is_fsdp2=True)
    assert mesh is config.device_mesh and mesh.mesh_dim_names == ("dp_shard", "tp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # flattened views are read without torch's warning
        assert submesh(mesh, "dp").size() == 2
        assert (mesh_size(mesh, "tp"), mesh_size(mesh, "cp")) == (2, 1)
        assert (mesh_local_rank(mesh, "dp"), mesh_local_rank(mesh, "tp")) == (1, 1)
    assert submesh(mesh, "cp") is None and submesh(None, "tp") is None
    assert [data_parallel_share(mesh, 4, rank) for rank in range(4)] == [
        (2, 0),
        (2, 0),
        (2, 1),
        (2, 1),
    ]
    assert data_parallel_share(None, 4, 3) == (4, 3)


def test_accelerator_refuses_tensor_parallel_with_deepspeed() -> None:
    from hasten import Accelerator
    from hasten.config.deepspeed import DeepSpeedPlugin

    with pytest.raises(ValueError, match=r"tp_size=2\) cannot be used with DeepSpeed") as error:
        Accelerator(
            deepspeed_plugin=DeepSpeedPlugin(zero_stage=2),
            parallelism_config=ParallelismConfig(tp_size=2),
        )
    assert "Use FSDP2 (fsdp_plugin) for tensor/context parallelism" in str(error.value)

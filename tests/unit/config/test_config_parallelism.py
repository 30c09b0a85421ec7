"""config.parallelism: ParallelismConfig sizes, dims, validation, device mesh on a fake group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from hasten.config.envvars import read_prefixed
from hasten.config.parallelism import (
    DeepSpeedSequenceParallelConfig,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)


@pytest.fixture(autouse=True)
def _no_parallelism_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in read_prefixed("PARALLELISM_CONFIG_"):
        monkeypatch.delenv(name)


def test_defaults_are_all_ones() -> None:
    config = ParallelismConfig()
    assert config.total_size == 1
    assert config.active_mesh_dims == []
    assert (config.cp_backend, config.sp_backend) == ("torch", "deepspeed")
    assert config.tp_handler is config.cp_handler is config.sp_handler is None
    assert config.fsdp_dim_names == ["dp_shard_cp"]


def test_sizes_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig()
    assert (config.dp_shard_size, config.cp_size, config.total_size) == (2, 2, 4)
    assert isinstance(config.cp_handler, TorchContextParallelConfig)
    assert config.cp_handler.cp_comm_strategy == "alltoall"


def test_dimension_names() -> None:
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert config.non_dp_dim_names == ["cp"]
    assert config.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert config.dp_cp_dim_names == ["dp_replicate", "dp_shard", "cp"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert (config.data_parallel_size, config.non_data_parallel_size, config.total_size) == (
        4,
        2,
        8,
    )
    assert config._get_mesh() == (("dp_replicate", "dp_shard", "cp"), (2, 2, 2))


def test_tensor_parallel_handler() -> None:
    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert isinstance(config.tp_handler, TorchTensorParallelConfig)
    assert config._get_mesh() == (("dp_shard", "tp"), (2, 2))
    with pytest.warns(UserWarning, match="enable_async_tp=True\\) is not supported"):
        TorchTensorParallelConfig(enable_async_tp=True)


def test_tensor_parallel_config_does_not_need_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    import hasten.core.imports as imports

    # plain PyTorch models are sharded from their own plan; transformers is optional
    monkeypatch.setattr(imports, "is_transformers_available", lambda: False)
    assert TorchTensorParallelConfig().enable_async_tp is False


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"tp_size": 0}, ValueError, r"tp_size=0\) must be an int >= 1"),
        ({"dp_shard_size": "2"}, ValueError, r"dp_shard_size='2'\) must be an int >= 1"),
        ({"cp_backend": "ring"}, ValueError, r"cp_backend='ring'\) must be 'torch'"),
        ({"sp_backend": "ulysses"}, ValueError, r"sp_backend='ulysses'\) must be 'deepspeed'"),
        ({"cp_size": 2, "sp_size": 2}, ValueError, r"mutually exclusive"),
        (
            {"dp_replicate_size": 2, "cp_size": 2},
            ValueError,
            r"cannot be combined with pure replication",
        ),
        (
            {"dp_shard_size": 2, "cp_size": 2, "cp_handler": object()},
            TypeError,
            r"needs a TorchContextParallelConfig",
        ),
    ],
)
def test_errors(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ParallelismConfig(**options)


def test_context_parallel_strategy_is_validated() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Invalid cp_comm_strategy: ring\. Must be one of 'allgather' or 'alltoall'\. \(hasten",
    ):
        TorchContextParallelConfig(cp_comm_strategy="ring")


def test_sequence_parallel_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DeepSpeedSequenceParallelConfig().sp_seq_length_is_variable is True
    with pytest.raises(ValueError, match="needs sp_seq_length"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "512")
    assert DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False).sp_seq_length == 512
    assert DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2")
    with pytest.raises(
        ValueError,
        match=r"^Invalid sp_attn_implementation: eager\. .* 'eager' and 'flex_attention' cannot",
    ):
        DeepSpeedSequenceParallelConfig(sp_attn_implementation="eager")
    config = ParallelismConfig(sp_size=2)
    assert isinstance(config.sp_handler, DeepSpeedSequenceParallelConfig)
    assert config.build_device_mesh("cpu") is None  # DeepSpeed owns its sequence groups


def test_validate_for_a_job() -> None:
    assert ParallelismConfig().validate_for(1, multi_device=False) == []
    config = ParallelismConfig()
    assert config.validate_for(4, multi_device=True) == []
    assert config.dp_replicate_size == 4  # pure replication over every process
    with pytest.raises(
        ValueError, match=r"total_size \(4\) does not match the number of processes \(8\)"
    ):
        ParallelismConfig(dp_shard_size=4).validate_for(8, multi_device=True)
    with pytest.raises(ValueError, match="no dimension to shard over"):
        ParallelismConfig(dp_replicate_size=2).validate_for(2, multi_device=True, is_fsdp2=True)
    with pytest.raises(ValueError, match="needs FSDP2, DeepSpeed or a multi-device"):
        ParallelismConfig(dp_shard_size=2).validate_for(2, multi_device=False)
    config = ParallelismConfig(dp_shard_size=2, cp_handler=TorchContextParallelConfig())
    assert config.validate_for(2, multi_device=True, is_fsdp2=True) == [
        "ParallelismConfig.cp_handler is set but cp_size is 1; it is ignored"
    ]


def test_to_json() -> None:
    data = ParallelismConfig(dp_shard_size=2, cp_size=2).to_json()
    assert data["dp_shard_size"] == 2
    assert data["cp_handler"] == {"cp_comm_strategy": "allgather"}


@pytest.fixture
def fake_group() -> Iterator[None]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=1, world_size=8, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:Slicing a flattened dim")
def test_build_device_mesh_with_flattened_views(fake_group: None) -> None:
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    mesh = config.get_device_mesh("cpu")
    assert mesh is not None
    assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "cp")
    assert mesh["dp"].size() == 4
    assert mesh["dp_shard_cp"].size() == 4
    assert mesh["dp_cp"].size() == 8
    assert config.get_device_mesh() is mesh
    with pytest.raises(ValueError, match="already built on 'cpu'"):
        config.get_device_mesh("cuda")


@pytest.mark.filterwarnings("ignore:Slicing a flattened dim")
def test_flattened_view_of_the_whole_mesh(fake_group: None) -> None:
    # dims given as a list (as Accelerate slices): the whole-mesh case is a slice, not `self`
    mesh = ParallelismConfig(dp_shard_size=8).get_device_mesh("cpu")
    assert mesh is not None and mesh["dp"].size() == 8 and mesh["dp_shard_cp"].size() == 8


def test_flattened_views_are_sliced_by_lists_of_dim_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.device_mesh as device_mesh

    sliced: list[tuple[object, str]] = []

    class Mesh:
        def __getitem__(self, key: object) -> object:
            return type("Sub", (), {"_flatten": lambda _, name: sliced.append((key, name))})()

    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *a, **k: Mesh())
    ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2).build_device_mesh("cpu")
    assert sliced == [
        (["dp_replicate", "dp_shard"], "dp"),
        (["dp_shard", "cp"], "dp_shard_cp"),
        (["dp_replicate", "dp_shard", "cp"], "dp_cp"),
    ]


def test_get_device_mesh_needs_a_device_type() -> None:
    with pytest.raises(ValueError, match=r"pass the device type, e.g. get_device_mesh\('cuda'\)"):
        ParallelismConfig().get_device_mesh()
    assert ParallelismConfig().build_device_mesh("cpu") is None


def test_refuse_recurrent_layers_names_the_linear_attention_types() -> None:
    from types import SimpleNamespace

    from hasten.big_modeling import _refuse_recurrent_layers_under_sequence_parallelism
    from hasten.config.parallelism import refuse_recurrent_layers

    assert _refuse_recurrent_layers_under_sequence_parallelism is refuse_recurrent_layers

    def model(config: object) -> object:
        return type("Hybrid", (), {"config": config})()

    text = SimpleNamespace(layer_types=["full_attention", "linear_attention", "linear_attention"])
    outer = SimpleNamespace(get_text_config=lambda: text)  # multimodal: the text config decides
    with pytest.raises(ValueError, match=r"^Hybrid has layers of type \['linear_attention'\]"):
        refuse_recurrent_layers(model(outer))
    refuse_recurrent_layers(model(SimpleNamespace(layer_types=["full_attention"])))
    refuse_recurrent_layers(model(SimpleNamespace()))  # no layer_types: nothing to refuse
    refuse_recurrent_layers(object())  # no config at all

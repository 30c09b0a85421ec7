"""detect_run and environments: every launcher/platform combination, without processes."""

from __future__ import annotations

import pytest

from hasten.config.enums import DistributedType
from hasten.platforms.cpu import CpuPlatform
from hasten.platforms.cuda import CudaPlatform
from hasten.platforms.mps import MpsPlatform
from hasten.platforms.npu import NpuPlatform
from hasten.platforms.xpu import XpuPlatform
from hasten.state.detect import (
    detect_run,
    main_is_last_process,
    runs_distributed,
)
from hasten.state.environments import RankInfo, find_ranks, ranks_from_mpi, ranks_from_torchrun

CPU = CpuPlatform()
CUDA = CudaPlatform()


def torchrun(
    rank: int = 1, world: int = 2, local: int | None = None, **extra: str
) -> dict[str, str]:
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank if local is None else local),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "1234",
    }
    env.update(extra)
    return env


def test_no_launcher_is_a_single_process_on_the_platform() -> None:
    spec = detect_run({}, CUDA)
    assert spec.distributed_type == DistributedType.NO
    assert spec.backend is None and not spec.needs_process_group
    assert (spec.num_processes, spec.process_index, spec.local_process_index) == (1, 0, 0)
    assert spec.device_type == "cuda"


def test_no_launcher_with_cpu_flag_computes_on_cpu() -> None:
    assert detect_run({}, CUDA, cpu=True).device_type == "cpu"
    spec = detect_run({"ACCELERATE_USE_CPU": "true"}, CUDA)
    assert spec.device_type == "cpu" and spec.cpu


def test_torchrun_on_cpu_only_host_is_multi_cpu_gloo_without_cpu_flag() -> None:
    spec = detect_run(torchrun(rank=1, world=2), CPU)
    assert spec.distributed_type == DistributedType.MULTI_CPU
    assert spec.backend == "gloo"
    assert (spec.num_processes, spec.process_index, spec.local_process_index) == (2, 1, 1)
    assert spec.device_type == "cpu" and spec.source == "torchrun"
    assert dict(spec.env_updates) == {}


def test_torchrun_with_one_process_still_makes_a_group() -> None:
    spec = detect_run(torchrun(rank=0, world=1), CPU)
    assert spec.distributed_type == DistributedType.MULTI_CPU and spec.num_processes == 1


@pytest.mark.parametrize("env", [{"LOCAL_RANK": "0"}, {"RANK": "0", "WORLD_SIZE": "1"}])
def test_stray_rank_variables_without_rendezvous_are_a_single_process(env: dict[str, str]) -> None:
    for platform, device_type in ((CPU, "cpu"), (CUDA, "cuda")):
        spec = detect_run(env, platform)
        assert spec.distributed_type == DistributedType.NO and spec.backend is None
        assert (spec.num_processes, spec.device_type) == (1, device_type)


@pytest.mark.parametrize(
    ("platform", "kind", "backend"),
    [
        (CUDA, DistributedType.MULTI_GPU, "nccl"),
        (XpuPlatform(), DistributedType.MULTI_XPU, "xccl"),
        (NpuPlatform(), DistributedType.MULTI_NPU, "hccl"),
        (MpsPlatform(), DistributedType.MULTI_CPU, "gloo"),
    ],
)
def test_torchrun_on_each_accelerator(
    platform: object, kind: DistributedType, backend: str
) -> None:
    spec = detect_run(torchrun(rank=3, world=4, local=1), platform)  # type: ignore[arg-type]
    assert spec.distributed_type == kind and spec.backend == backend
    assert (spec.process_index, spec.local_process_index) == (3, 1)


def test_cpu_flag_on_gpu_host_is_multi_cpu() -> None:
    spec = detect_run(torchrun(), CUDA, cpu=True)
    assert spec.distributed_type == DistributedType.MULTI_CPU and spec.backend == "gloo"
    assert spec.device_type == "cpu"


def test_requested_backend_is_kept_on_gpu_and_checked_on_cpu() -> None:
    assert detect_run(torchrun(), CUDA, backend="gloo").backend == "gloo"
    assert detect_run(torchrun(), CPU, backend="mpi").backend == "mpi"
    with pytest.raises(ValueError, match=r"backend='nccl' cannot join CPU processes.*gloo"):
        detect_run(torchrun(), CPU, backend="nccl")


def test_fsdp_offload_adds_a_cpu_gloo_group() -> None:
    env = torchrun(ACCELERATE_USE_FSDP="true", FSDP_OFFLOAD_PARAMS="true")
    assert detect_run(env, CUDA).backend == "cuda:nccl,cpu:gloo"
    env = torchrun(ACCELERATE_USE_FSDP="true", FSDP_STATE_DICT_TYPE="FULL_STATE_DICT")
    assert detect_run(env, CUDA).backend == "cuda:nccl,cpu:gloo"
    assert detect_run(torchrun(ACCELERATE_USE_FSDP="true"), CUDA).backend == "nccl"


def test_deepspeed_env_marks_deepspeed_on_accelerators_only() -> None:
    spec = detect_run(torchrun(ACCELERATE_USE_DEEPSPEED="true"), CUDA)
    assert spec.distributed_type == DistributedType.DEEPSPEED and spec.use_deepspeed
    spec = detect_run(torchrun(ACCELERATE_USE_DEEPSPEED="true"), CPU)
    assert spec.distributed_type == DistributedType.MULTI_CPU and not spec.use_deepspeed


def test_sagemaker_data_parallel_uses_smddp() -> None:
    env = torchrun(
        ACCELERATE_USE_SAGEMAKER="true", ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE="DATA_PARALLEL"
    )
    spec = detect_run(env, CUDA)
    assert spec.backend == "smddp" and spec.distributed_type == DistributedType.MULTI_GPU
    env["ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE"] = "NO"
    assert detect_run(env, CUDA).backend == "nccl"


@pytest.mark.parametrize(
    "env",
    [
        {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "4"},
        {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"},
        {"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "0"},
    ],
)
def test_mpi_launch_on_cpu_fills_in_rendezvous_variables(env: dict[str, str]) -> None:
    spec = detect_run(env, CPU)
    assert spec.distributed_type == DistributedType.MULTI_CPU and spec.backend == "gloo"
    assert (spec.num_processes, spec.process_index) == (4, 2) and spec.source == "mpi"
    updates = dict(spec.env_updates)
    assert updates["RANK"] == "2" and updates["WORLD_SIZE"] == "4"
    assert updates["MASTER_ADDR"] == "127.0.0.1" and updates["MASTER_PORT"] == "29500"
    assert updates["LOCAL_RANK"] == str(spec.local_process_index)


def test_mpi_launch_prefers_mpi_backend_when_built() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert detect_run(env, CPU, mpi_available=True).backend == "mpi"
    assert detect_run(env, CPU, mpi_available=False).backend == "gloo"


def test_mpi_multinode_without_master_addr_is_an_error() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    with pytest.raises(ValueError, match="MASTER_ADDR is not set"):
        detect_run(env, CPU)
    env["MASTER_ADDR"] = "node0"
    assert detect_run(env, CPU).env_updates["MASTER_ADDR"] == "node0"


def test_mpi_size_one_is_not_distributed() -> None:
    assert (
        detect_run({"PMI_SIZE": "1", "PMI_RANK": "0"}, CPU).distributed_type == DistributedType.NO
    )


def test_torchrun_wins_over_mpi_variables() -> None:
    env = torchrun(rank=1, world=2, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="8")
    assert detect_run(env, CPU).num_processes == 2


def test_ranks_from_torchrun_reads_every_variable() -> None:
    info = ranks_from_torchrun(torchrun(rank=5, world=8, local=1))
    assert info == RankInfo("torchrun", 5, 8, 1, 8, "10.0.0.1", 1234)
    assert ranks_from_torchrun({}) is None


def test_ranks_from_torchrun_without_local_rank_assumes_one_machine() -> None:
    info = ranks_from_torchrun({"RANK": "1", "WORLD_SIZE": "2"})
    assert info is not None and (info.local_rank, info.local_world_size) == (1, 2)


def test_ranks_from_mpi_derives_local_rank() -> None:
    info = ranks_from_mpi({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALNRANKS": "4"})
    assert info is not None and info.local_rank == 1
    assert find_ranks({}) is None


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, r"rank=2 and world size=2"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, r"local rank=-1"),
        ({"RANK": "zero", "WORLD_SIZE": "2"}, r"RANK='zero' could not be parsed"),
    ],
)
def test_inconsistent_rank_variables_are_errors(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        detect_run(env, CPU)


def test_labels() -> None:
    assert not runs_distributed(DistributedType.NO)
    assert runs_distributed(DistributedType.MULTI_CPU)
    assert main_is_last_process(DistributedType.MEGATRON_LM)
    assert not main_is_last_process(DistributedType.MULTI_GPU)

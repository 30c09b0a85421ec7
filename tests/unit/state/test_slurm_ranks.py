"""Ranks from SLURM's srun variables (one task per process, no launcher): a faked environment."""

from __future__ import annotations

import pytest

from hasten.config.enums import DistributedType
from hasten.platforms.cpu import CpuPlatform
from hasten.platforms.cuda import CudaPlatform
from hasten.state.detect import detect_run
from hasten.state.environments import RankInfo, find_ranks, ranks_from_slurm, slurm_port


def srun(procid: int, **extra: str) -> dict[str, str]:
    """What ``srun -N 2 --ntasks-per-node 4 python train.py`` sets for task ``procid``."""
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % 4),
        "SLURM_NODEID": str(procid // 4),
        "SLURM_NTASKS": "8",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    env.update(extra)
    return env


def test_each_srun_task_is_a_rank_with_the_first_node_as_rendezvous() -> None:
    info = ranks_from_slurm(srun(5))
    assert info == RankInfo("slurm", 5, 8, 1, 4, "gpu07", slurm_port(123456))
    assert slurm_port(123456) == 23456  # the same on every task of the job


def test_master_addr_and_port_set_by_the_user_win() -> None:
    info = ranks_from_slurm(srun(0, MASTER_ADDR="10.1.2.3", MASTER_PORT="29400"))
    assert info is not None and (info.master_addr, info.master_port) == ("10.1.2.3", 29400)


@pytest.mark.parametrize(
    ("per_node", "node", "local_size"),
    [("2(x3),1", 3, 1), ("2(x3),1", 1, 2), ("3", 0, 3), ("garbled", 0, 8)],
)
def test_tasks_per_node_gives_the_local_size(per_node: str, node: int, local_size: int) -> None:
    env = srun(0, SLURM_STEP_TASKS_PER_NODE=per_node, SLURM_NODEID=str(node))
    info = ranks_from_slurm(env)
    assert info is not None and info.local_world_size == local_size


@pytest.mark.parametrize(
    "env",
    [
        {k: v for k, v in srun(0).items() if k != "SLURM_STEP_ID"},  # the batch script's shell
        srun(0, SLURM_STEP_ID="batch"),
        srun(0, SLURM_STEP_ID="4294967294"),
        srun(0, SLURM_STEP_NUM_TASKS="1"),  # a one-task step
        {k: v for k, v in srun(0).items() if k != "SLURM_PROCID"},
    ],
)
def test_outside_a_multi_task_srun_step_it_is_one_process(env: dict[str, str]) -> None:
    assert ranks_from_slurm(env) is None
    assert detect_run(env, CpuPlatform()).distributed_type == DistributedType.NO


def test_torchrun_variables_win_inside_srun() -> None:
    # `srun hasten launch`: the launcher's workers carry torchrun's ranks and srun's task ids
    env = srun(1, RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="gpu07")
    info = find_ranks(env)
    assert info is not None and (info.source, info.rank, info.world_size) == ("torchrun", 3, 4)


def test_detect_run_fills_in_the_rendezvous_for_srun_tasks() -> None:
    spec = detect_run(srun(6), CpuPlatform())
    assert spec.distributed_type == DistributedType.MULTI_CPU and spec.source == "slurm"
    assert (spec.num_processes, spec.process_index, spec.local_process_index) == (8, 6, 2)
    assert dict(spec.env_updates) == {
        "RANK": "6",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_PORT": "23456",
        "MASTER_ADDR": "gpu07",
    }
    assert detect_run(srun(6), CudaPlatform()).backend == "nccl"


def test_a_multi_node_step_without_a_node_list_needs_master_addr() -> None:
    env = {k: v for k, v in srun(0).items() if not k.endswith("NODELIST")}
    with pytest.raises(ValueError, match="SLURM launch spans several machines"):
        detect_run(env, CpuPlatform())

"""Processes started as SLURM ``srun`` tasks (faked): only SLURM's variables, no launcher.

Each forked worker drops torchrun's variables and gets what ``srun -N 1 -n 2`` would set; the
rendezvous port comes from the job id. They train a step, save and load a checkpoint.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed
from hasten.state.environments import slurm_port

pytestmark = pytest.mark.distributed

TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _job_with_a_free_port() -> int:
    """A job id whose rendezvous port (20000 + id mod 10000) is free on loopback now."""
    for _ in range(100):
        job = random.randrange(1_000_000, 2_000_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", slurm_port(job)))
            except OSError:
                continue
        return job
    raise RuntimeError("no free port in 20000-29999")


def _as_srun_task(job: int, folder: str) -> dict[str, Any]:
    from hasten import Accelerator

    procid = os.environ["RANK"]
    for name in (*TORCHRUN, "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    os.environ.update(
        SLURM_JOB_ID=str(job),
        SLURM_STEP_ID="0",
        SLURM_PROCID=procid,
        SLURM_LOCALID=procid,
        SLURM_NODEID="0",
        SLURM_NTASKS="2",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_STEP_NODELIST="127.0.0.1",
    )
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    ranks = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
    accelerator.save_state(folder)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(folder)
    restored = all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    info = {
        "index": accelerator.process_index,
        "local": accelerator.local_process_index,
        "world": accelerator.num_processes,
        "ranks": ranks,
        "master": os.environ.get("MASTER_ADDR"),
        "port": os.environ.get("MASTER_PORT"),
        "restored": restored,
    }
    accelerator.end_training()
    return info


@pytest.mark.timeout(120)
def test_srun_tasks_form_the_group_and_checkpoint(tmp_path: Path) -> None:
    job = _job_with_a_free_port()
    found = run_distributed(_as_srun_task, job, str(tmp_path / "ckpt"), timeout=90)
    for rank, info in enumerate(found):
        assert info == {
            "index": rank,
            "local": rank,
            "world": 2,
            "ranks": [0, 1],
            "master": "127.0.0.1",
            "port": str(slurm_port(job)),
            "restored": True,
        }

"""A gloo group hasten destroys is kept until its worker threads are idle (`state/teardown.py`).

torch 2.13 deadlocks when a destroyed gloo group's last reference goes (DDP's reducer, freed with
the model) while one of the group's threads still drops the work of a collective issued during
backward: the destructor joins the thread holding the GIL, and the thread needs the GIL.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed

ROUNDS = 20


def _train_destroy_free(use_teardown: bool) -> dict[str, int]:
    import torch.distributed as dist

    from hasten.state.teardown import destroy_group, release_retired, retired_group_count

    rank = int(os.environ["RANK"])
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 2, rank == 0)
    for round_ in range(ROUNDS):
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(f"round{round_}/", store), rank=rank, world_size=2
        )
        model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
        model(torch.randn(8, 64)).sum().backward()
        dist.barrier()
        if use_teardown:
            destroy_group()
        else:
            dist.destroy_process_group()
        del model  # the reducer held the last reference to the group but for the teardown's
    held = retired_group_count()
    release_retired()
    return {"held": held, "after_release": retired_group_count()}


@pytest.mark.timeout(90)
def test_freeing_a_ddp_model_after_its_group_is_destroyed_does_not_hang() -> None:
    # Without destroy_group (plain dist.destroy_process_group) 2 runs in 3 hang within 20 rounds.
    results = run_distributed(_train_destroy_free, True, timeout=60)
    for result in results:
        assert result == {"held": ROUNDS, "after_release": 0}


def _end_training_keeps_the_group() -> dict[str, object]:
    from hasten import Accelerator
    from hasten.state.teardown import retired_group_count

    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(4, 2))
    accelerator.backward(model(torch.randn(3, 4)).sum())
    accelerator.end_training()
    held = retired_group_count()
    del model
    restarted = Accelerator()  # a new group: the retired one is released first
    return {"held": held, "after_restart": retired_group_count(), "n": restarted.num_processes}


@pytest.mark.timeout(90)
def test_end_training_retires_the_group_and_a_new_accelerator_releases_it() -> None:
    results = run_distributed(_end_training_keeps_the_group, timeout=60)
    for result in results:
        assert result == {"held": 1, "after_restart": 0, "n": 2}

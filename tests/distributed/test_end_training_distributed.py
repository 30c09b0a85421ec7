"""end_training() destroys the process group hasten made; later calls behave sensibly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed]


def _lifecycle(folder: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hasten import Accelerator

    acc = Accelerator(cpu=True, log_with="jsonl", project_dir=folder)
    acc.init_trackers("run")
    acc.log({"loss": 1.0}, step=0)
    model = acc.prepare(torch.nn.Linear(2, 2))
    acc.save_state(f"{folder}/ckpt", async_save=True)
    acc.end_training()
    out: dict[str, Any] = {"after_end": dist.is_initialized()}
    out["saved"] = Path(f"{folder}/ckpt").is_dir()  # the pending async save completed first
    errors = []
    for call in (acc.wait_for_everyone, lambda: acc.gather(torch.ones(1))):
        try:
            call()
            errors.append("no error")
        except ValueError as err:  # Accelerate's type (torch's for a missing group)
            errors.append(f"{type(err).__name__}: {err}")
    out["errors"] = errors
    # A new Accelerator on every process starts a new group; collectives work again.
    again = Accelerator(cpu=True)
    out["restarted"] = dist.is_initialized()
    rank = torch.tensor([float(again.process_index)])
    out["gathered"] = again.gather(rank).tolist()
    again.wait_for_everyone()
    again.end_training()
    out["after_second_end"] = dist.is_initialized()
    del model
    return out


@pytest.mark.timeout(120)
def test_end_training_destroys_the_group_and_a_new_accelerator_restarts_it(
    tmp_path: Path,
) -> None:
    ranks = run_distributed(_lifecycle, str(tmp_path), world_size=2, timeout=90)
    for out in ranks:
        assert out["after_end"] is False
        assert out["saved"] is True
        assert len(out["errors"]) == 2
        for message in out["errors"]:
            assert message.startswith("ProcessGroupDestroyedError: ")
            assert "end_training() (or destroy_process_group()) destroyed it" in message
            assert "create a new Accelerator()" in message
        assert out["restarted"] is True
        assert out["gathered"] == [0.0, 1.0]
        assert out["after_second_end"] is False


def _adopted_group() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hasten import Accelerator

    dist.init_process_group("gloo")  # made by its owner (Ray Train, or the user) first
    world = dist.group.WORLD
    acc = Accelerator(cpu=True)
    total = acc.reduce(torch.ones(1), "sum")
    acc.end_training()
    out = {
        "owns": acc.state.owns_process_group,
        "same_group": dist.group.WORLD is world,  # adopted, not made again
        "sum": total.tolist(),
        "alive_after_end": dist.is_initialized(),
    }
    dist.barrier()  # the owner still uses it
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(120)
def test_end_training_leaves_a_group_it_did_not_make_to_its_owner() -> None:
    for out in run_distributed(_adopted_group, world_size=2, timeout=90):
        assert out == {"owns": False, "same_group": True, "sum": [2.0], "alive_after_end": True}

"""The one save transaction: claim, check, write, publish once; a failure publishes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _support.distributed import run_distributed
from hasten.checkpointing.storage.agreement import next_token
from hasten.checkpointing.storage.manifest import read_manifest
from hasten.checkpointing.storage.transaction import save_transaction
from hasten.checkpointing.storage.writer import SavePlan, SaveTarget, pickle_job
from hasten.state import PartialState


def _plan(final: Path) -> SavePlan:
    state = PartialState()
    target = SaveTarget(
        final=final.absolute(),
        rank=state.process_index,
        num_processes=state.num_processes,
        token=next_token(),
        attributes={"num_processes": state.num_processes},
    )
    return SavePlan(target, is_writer=state.is_main_process)


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_success_publishes_once_with_a_manifest(tmp_path: Path) -> None:
    plan = _plan(tmp_path / "ckpt")
    with save_transaction(plan, one_folder=None) as transaction:
        assert not plan.final.exists()  # claimed, staged, not yet published
        plan.jobs.append(pickle_job("state.bin", {"x": torch.ones(2)}))
        plan.shared_names.append("state.bin")
        assert transaction.publish() == plan.final
    assert (plan.final / "state.bin").is_file()
    assert "state.bin" in read_manifest(plan.final)["files"]
    assert _leftovers(tmp_path) == []


def test_a_failed_write_publishes_nothing_and_removes_the_staging(tmp_path: Path) -> None:
    plan = _plan(tmp_path / "ckpt")
    with pytest.raises(OSError, match="disk full"):
        with save_transaction(plan, one_folder="A sharded checkpoint"):
            (plan.staging / "half_written").write_bytes(b"x")
            raise OSError(28, "disk full")
    assert not plan.final.exists()
    assert _leftovers(tmp_path) == []


def test_a_body_that_never_publishes_is_refused(tmp_path: Path) -> None:
    plan = _plan(tmp_path / "ckpt")
    with pytest.raises(RuntimeError, match="ended without publishing: call publish"):
        with save_transaction(plan, one_folder=None):
            pass
    assert not plan.final.exists() and _leftovers(tmp_path) == []


def _fail_everywhere(root: str) -> str:
    plan = _plan(Path(root) / "ckpt")
    try:
        with save_transaction(plan, one_folder="A sharded checkpoint"):
            raise OSError(28, f"disk full on {plan.rank}")
    except OSError as exc:
        return str(exc)
    return "published"


def _succeed_everywhere(root: str) -> list[str]:
    plan = _plan(Path(root) / "ckpt")
    with save_transaction(plan, one_folder=None) as transaction:
        name = f"part_{plan.rank}.bin"
        plan.jobs.append(pickle_job(name, {"rank": plan.rank}))
        transaction.publish()
    return sorted(read_manifest(plan.final)["files"])  # every rank sees it published


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_every_process_raises_and_nothing_is_published(tmp_path: Path) -> None:
    results = run_distributed(_fail_everywhere, str(tmp_path), timeout=60)
    assert results == ["[Errno 28] disk full on 0", "[Errno 28] disk full on 1"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_two_processes_publish_one_folder_listing_both_parts(tmp_path: Path) -> None:
    results = run_distributed(_succeed_everywhere, str(tmp_path), timeout=60)
    assert results[0] == results[1] == ["part_0.bin", "part_1.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]

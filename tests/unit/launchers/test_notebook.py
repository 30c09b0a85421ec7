from __future__ import annotations

from pathlib import Path

import pytest

from hasten.launchers import notebook
from hasten.launchers.notebook import debug_launcher, notebook_launcher


def _all_reduce_job(out_dir: str, tag: str) -> None:
    """Join the group the launcher prepared, all-reduce the ranks, write what was seen."""
    import torch
    import torch.distributed as dist

    from hasten.config import envvars

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    precision = envvars.read("ACCELERATE_MIXED_PRECISION")
    Path(out_dir, f"{tag}{rank}").write_text(
        f"{dist.get_world_size()} {total.item():.0f} {precision}"
    )
    dist.destroy_process_group()


def _fail_on_rank_one() -> None:
    from hasten.config import envvars

    if envvars.read("RANK") == "1":
        raise ValueError("rank one is unhappy")


@pytest.mark.timeout(60)
def test_debug_launcher_runs_two_cpu_processes(tmp_path: Path) -> None:
    debug_launcher(_all_reduce_job, args=(str(tmp_path), "d"), num_processes=2)
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["2 3 no", "2 3 no"]


def _record_state(out_dir: str) -> None:
    from hasten import Accelerator

    accelerator = Accelerator()
    Path(out_dir, "state").write_text(f"{accelerator.distributed_type} {accelerator.num_processes}")


@pytest.mark.timeout(60)
def test_debug_launcher_with_one_process_is_a_plain_single_process(tmp_path: Path) -> None:
    # As Accelerate's: no process group, so DistributedType.NO (its test_sync relies on it).
    debug_launcher(_record_state, args=(str(tmp_path),), num_processes=1)
    assert (tmp_path / "state").read_text() == "DistributedType.NO 1"


@pytest.mark.timeout(60)
def test_notebook_launcher_runs_two_processes_with_precision(tmp_path: Path) -> None:
    from _support.distributed import free_port

    notebook_launcher(
        _all_reduce_job,
        args=(str(tmp_path), "n"),
        num_processes=2,
        mixed_precision="bf16",
        use_port=str(free_port()),
    )
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["2 3 bf16", "2 3 bf16"]


@pytest.mark.timeout(60)
def test_notebook_launcher_reports_the_failing_rank() -> None:
    from _support.distributed import free_port

    with pytest.raises(RuntimeError, match="rank one is unhappy") as info:
        notebook_launcher(_fail_on_rank_one, num_processes=2, use_port=str(free_port()))
    assert "rank 1" in str(info.value)
    # torch's ChildFailedError too: Accelerate's notebook_launcher raises that (its tests catch it)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    assert isinstance(info.value, ChildFailedError) and info.value.failures


def test_one_process_runs_in_this_process() -> None:
    seen: list[str | None] = []

    def job(value: int) -> None:
        from hasten.config import envvars

        seen.append(f"{value} {envvars.read('ACCELERATE_MIXED_PRECISION')}")

    notebook_launcher(job, args=(3,), num_processes=1, mixed_precision="fp16")
    assert seen == ["3 fp16"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_processes": None}, "pass the number of processes"),
        ({"num_processes": 2, "node_rank": 1, "num_nodes": 1}, "node_rank=1 must be in"),
        ({"num_processes": 2, "mixed_precision": "fp32"}, "Unknown mixed_precision 'fp32'"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        notebook_launcher(print, **kwargs)  # type: ignore[arg-type]


def test_refuses_to_fork_after_cuda_init(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA was already initialised"):
        notebook_launcher(print, num_processes=2)


def test_refuses_to_fork_with_state_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notebook, "_state_in_use", lambda: True)
    with pytest.raises(RuntimeError, match="already exists in this process"):
        notebook_launcher(print, num_processes=2)


def test_debug_launcher_needs_a_process() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        debug_launcher(print, num_processes=0)


def test_notebook_launcher_refuses_after_bitsandbytes_was_imported_on_a_gpu_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    import torch

    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # where bnb sets up CUDA
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match=r"Please keep these imports .*\n\t\* `bitsandbytes`"):
        notebook_launcher(print, num_processes=2)


@pytest.mark.timeout(60)
def test_notebook_launcher_on_one_machine_moves_off_a_taken_port(tmp_path: Path) -> None:
    # another job holds the port (Accelerate's test_notebook uses the default 29500)
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = str(holder.getsockname()[1])
        notebook_launcher(
            _all_reduce_job, args=(str(tmp_path), "p"), num_processes=2, use_port=taken
        )
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["2 3 no", "2 3 no"]

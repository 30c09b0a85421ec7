"""Checkpoints when the processes do not share a folder (nodes without shared storage, Ray workers).

Each process saves into a folder of its own; the processes agree over the process group on what
each wrote, so nothing waits for files it cannot see. Resuming happens in new processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.distributed import DistributedTestError, run_distributed

pytestmark = pytest.mark.distributed


def _folder(root: str, rank: int) -> str:
    return str(Path(root) / f"worker{rank}" / "ckpt")


def _setup(seed: int = 0, **kwargs: Any) -> tuple[Any, Any, Any, Any]:
    from hasten import Accelerator
    from hasten.utils import set_seed

    accelerator = Accelerator(cpu=True, **kwargs)
    set_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _steps(accelerator: Any, model: Any, optimizer: Any, scheduler: Any, n: int) -> list[float]:
    losses = []
    for _ in range(n):
        # drawn from the (saved and restored) RNG: an exact resume draws the same data
        x = torch.randn(4, 8) + accelerator.process_index
        loss = model(x).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return losses


def _train_save_train(root: str, async_save: bool) -> dict[str, Any]:
    accelerator, model, optimizer, scheduler = _setup()
    _steps(accelerator, model, optimizer, scheduler, 3)
    folder = _folder(root, accelerator.process_index)
    start = time.perf_counter()
    accelerator.save_state(folder, async_save=async_save)
    after = _steps(accelerator, model, optimizer, scheduler, 3)
    accelerator.end_training()  # waits for an asynchronous save
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "after": after, "files": sorted(os.listdir(folder))}


def _load_own_folder(root: str) -> str:
    accelerator, model, optimizer, scheduler = _setup(seed=1)
    try:
        accelerator.load_state(_folder(root, accelerator.process_index))
    except (ValueError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    return "loaded"


def _resume(root: str) -> list[float]:
    accelerator, model, optimizer, scheduler = _setup(seed=1)  # different weights until loaded
    accelerator.load_state(_folder(root, accelerator.process_index))
    return _steps(accelerator, model, optimizer, scheduler, 3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("async_save", [False, True])
def test_per_process_folders_save_at_once_and_resume_once_merged(
    tmp_path: Path, async_save: bool
) -> None:
    root = str(tmp_path)
    first, second = run_distributed(_train_save_train, root, async_save, timeout=60)
    # rank 0 wrote what every process reads; rank 1 only its own file, with its own manifest
    assert "model.safetensors" in first["files"] and "optimizer.bin" in first["files"]
    assert {"hasten_manifest.json", "random_states_0.pkl"} <= set(first["files"])
    assert second["files"] == ["hasten_manifest_1.json", "random_states_1.pkl"]
    assert first["seconds"] < 20 and second["seconds"] < 20  # no wait for unseen files
    leftovers = [p for p in tmp_path.rglob(".*") if p.name.startswith(".")]
    assert leftovers == []  # no staging folder, claim or lock left behind
    manifest = json.loads((Path(_folder(root, 0)) / "hasten_manifest.json").read_text())
    assert [p["folder"] for p in manifest["processes"]] == [_folder(root, 0), _folder(root, 1)]
    if async_save:
        return  # the rest is the same for a checkpoint saved in the background

    # process 1's folder lacks what process 0 wrote: it says what and where; both raise
    errors = run_distributed(_load_own_folder, root, timeout=60)
    assert errors[1].startswith("CheckpointNotFoundError: Process 1 cannot load")
    assert f"model.safetensors (written by process 0 on {os.uname().nodename} into " in errors[1]
    assert _folder(root, 0) in errors[1]
    assert errors[0].startswith("RuntimeError: The checkpoint was not loaded: process 1:")

    # copied together (as Ray Train merges its workers' checkpoints) each resumes exactly
    for rank in (0, 1):
        for source in (0, 1):
            if source != rank:
                shutil.copytree(_folder(root, source), _folder(root, rank), dirs_exist_ok=True)
    resumed = run_distributed(_resume, root, timeout=60)
    assert resumed == [first["after"], second["after"]]


def _save_on_each_node(root: str, shared: bool) -> list[str]:
    accelerator, model, optimizer, scheduler = _setup(
        project_config=_project(save_on_each_node=True)
    )
    _steps(accelerator, model, optimizer, scheduler, 2)
    folder = str(Path(root) / "ckpt") if shared else _folder(root, accelerator.process_index)
    accelerator.save_state(folder)
    accelerator.wait_for_everyone()
    return sorted(os.listdir(folder))


def _project(**kwargs: Any) -> Any:
    from hasten.utils import ProjectConfiguration

    return ProjectConfiguration(**kwargs)


def _load_each_node(root: str, shared: bool) -> str:
    accelerator, model, optimizer, scheduler = _setup(seed=1)
    folder = str(Path(root) / "ckpt") if shared else _folder(root, accelerator.process_index)
    accelerator.load_state(folder)
    return "loaded"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shared", [False, True], ids=["node-local", "shared"])
def test_save_on_each_node_writes_a_complete_folder_per_machine(
    tmp_path: Path, shared: bool
) -> None:
    # two machines, one process each (one CPU thread: a forked worker's OpenMP pool is not
    # usable, and one local process would otherwise get every core)
    one_per_machine = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    listings = run_distributed(
        _save_on_each_node, str(tmp_path), shared, timeout=60, env=one_per_machine
    )
    if shared:  # both machines' writers saw one folder: one of them wrote the shared files
        assert listings[0] == listings[1]
        assert {"model.safetensors", "random_states_0.pkl", "random_states_1.pkl"} <= set(
            listings[0]
        )
        assert "hasten_manifest.json" in listings[0]
    else:  # every machine's folder holds everything, and loads on its own
        assert "model.safetensors" in listings[0] and "model.safetensors" in listings[1]
        assert "hasten_manifest_1.json" in listings[1]
    assert run_distributed(_load_each_node, str(tmp_path), shared, timeout=60) == ["loaded"] * 2


def _sharded_into_own_folders(root: str) -> str:
    from hasten import Accelerator
    from hasten.checkpointing.storage.agreement import FolderNotSharedError
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    try:
        accelerator.save_state(_folder(root, accelerator.process_index))
    except FolderNotSharedError as err:
        return str(err)
    return "saved"


@pytest.mark.timeout(120)
def test_sharded_checkpoint_into_unshared_folders_is_refused_before_writing(
    tmp_path: Path,
) -> None:
    messages = run_distributed(_sharded_into_own_folders, str(tmp_path), timeout=90)
    for message in messages:
        assert message.startswith("A sharded checkpoint needs one folder that every process")
        assert "processes 0" in message and "processes 1" in message
        assert "FULL_STATE_DICT" in message
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing written


def _sharded_saves_checked_once(root: str) -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.checkpointing.storage.agreement import FolderNotSharedError
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.state import PartialState

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    barriers = []
    state = PartialState()
    real_wait = type(state).wait_for_everyone

    def counted(self: Any) -> None:
        barriers.append(1)
        real_wait(self)

    type(state).wait_for_everyone = counted  # type: ignore[method-assign]
    counts = {}
    for name in ("a/ckpt_1", "a/ckpt_2", "b/ckpt_1"):  # a checked once; b, a new parent, checked
        before = len(barriers)
        accelerator.save_state(str(Path(root) / name))
        counts[name] = len(barriers) - before
    # each parent was checked (by different saves): a and b mixed are not known to be one folder
    mixed = str(Path(root) / ("a" if accelerator.process_index == 0 else "b") / "ckpt_3")
    try:
        accelerator.save_state(mixed)
        refused = "saved"
    except FolderNotSharedError as err:
        refused = str(err)
    # the same name in a checked parent on every process, but different names: not one folder
    odd = str(Path(root) / "a" / f"ckpt_odd{accelerator.process_index}")
    try:
        accelerator.save_state(odd)
        named = "saved"
    except FolderNotSharedError as err:
        named = str(err)
    return {"barriers": counts, "mixed": refused, "named": named}


@pytest.mark.timeout(120)
def test_a_shared_parent_folder_is_checked_once_and_mixed_folders_still_refused(
    tmp_path: Path,
) -> None:
    results = run_distributed(_sharded_saves_checked_once, str(tmp_path), timeout=90)
    for result in results:
        counts = result["barriers"]
        assert counts["a/ckpt_2"] < counts["a/ckpt_1"]  # the check's barrier is skipped
        assert counts["b/ckpt_1"] == counts["a/ckpt_1"]
        assert result["mixed"].startswith("A sharded checkpoint needs one folder")
        assert result["named"].startswith("A sharded checkpoint needs one folder")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["ckpt_1", "ckpt_2"]
    assert not (tmp_path / "a" / "ckpt_3").exists() and not (tmp_path / "b" / "ckpt_3").exists()


def _standalone_sharded_into_own_folders(root: str) -> list[str]:
    from hasten import Accelerator
    from hasten.checkpointing.dcp_folders import save_sharded_state
    from hasten.checkpointing.storage.agreement import FolderNotSharedError
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.utils.fsdp_utils import save_fsdp_model, save_fsdp_optimizer

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    folder = _folder(root, accelerator.process_index)
    saves = [
        lambda: save_sharded_state({"w": torch.ones(2)}, folder),
        lambda: save_fsdp_model(plugin, accelerator, model, folder),
        lambda: save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder),
    ]
    messages = []
    for save in saves:  # each refused on both processes, which stay in step for the next
        try:
            save()
            messages.append("saved")
        except FolderNotSharedError as err:
            messages.append(str(err))
    return messages


@pytest.mark.timeout(120)
def test_standalone_sharded_saves_into_unshared_folders_are_refused_not_hung(
    tmp_path: Path,
) -> None:
    results = run_distributed(_standalone_sharded_into_own_folders, str(tmp_path), timeout=90)
    for messages in results:
        assert len(messages) == 3
        for message in messages:
            assert message.startswith("A sharded checkpoint needs one folder that every process")
            assert "processes 0" in message and "processes 1" in message
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing written


def _one_cannot_make_its_folder(root: str) -> tuple[str, float]:
    accelerator, model, optimizer, scheduler = _setup()
    folder = Path(_folder(root, accelerator.process_index))
    if accelerator.process_index == 1:
        folder.parent.parent.mkdir(parents=True, exist_ok=True)
        folder.parent.write_text("a file where the folder's parent should be")
    start = time.perf_counter()
    try:
        accelerator.save_state(str(folder))
    except (OSError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}", time.perf_counter() - start
    return "saved", 0.0


@pytest.mark.timeout(120)
def test_a_process_that_cannot_write_makes_every_process_raise(tmp_path: Path) -> None:
    (first, took), (second, _) = run_distributed(
        _one_cannot_make_its_folder, str(tmp_path), timeout=60
    )
    assert second.startswith("NotADirectoryError: ") or second.startswith("OSError: ")
    assert "Cannot make the checkpoint folder" in second
    assert first.startswith("RuntimeError: Process 1 could not write its part of")
    assert "The checkpoint was not published" in first
    assert took < 20
    assert not any(p.name.startswith(".") for p in tmp_path.rglob("*"))
    assert not Path(_folder(str(tmp_path), 0)).exists()


def _peer_dies_while_writing(root: str, report: str) -> None:
    from hasten.checkpointing.storage import writer
    from hasten.state.recorder import CollectiveTimeoutError

    accelerator, model, optimizer, scheduler = _setup()
    if accelerator.process_index == 1:
        real = writer._write_job

        def die(folder: Path, job: Any) -> Any:
            if job.name.startswith("random_states"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(folder, job)

        writer._write_job = die
    start = time.perf_counter()
    try:
        accelerator.save_state(_folder(root, accelerator.process_index))
        message = "saved"
    except CollectiveTimeoutError as err:
        message = str(err)
    Path(report).write_text(
        json.dumps({"message": message, "seconds": time.perf_counter() - start})
    )


@pytest.mark.timeout(120)
def test_a_peer_that_dies_mid_save_is_an_error_within_seconds(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    with pytest.raises(DistributedTestError, match="rank 1 did not finish"):
        run_distributed(_peer_dies_while_writing, str(tmp_path), str(report), timeout=60)
    found = json.loads(report.read_text())
    message = found["message"]
    assert "a peer closed its connection" in message
    assert "save_state (agreeing on what was written)" in message
    # the dead process's last step names the file it was writing
    assert "rank 1: save_state: writing random_states_1.pkl into" in message
    assert found["seconds"] < 30  # REPORT_WAIT_S[0] (5 s) after the connection drops
    assert not Path(_folder(str(tmp_path), 0)).exists()

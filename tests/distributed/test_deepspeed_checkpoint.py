"""DeepSpeed checkpoints inside hasten's staged, verified folders: exact resume, kill -9, export.

The engine's files (each process its ZeRO partition) go through hasten's writer while it saves;
hasten lists them in the manifest, publishes the folder atomically, and on load verifies each (read
once) before the engine parses any. Asynchronous saves, saves mid-cycle and a process failing to
write are covered too.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.usefixtures("deepspeed_ops"),
    pytest.mark.timeout(600),  # the first DeepSpeed test of a fresh machine builds its op
]

BATCH, STEPS_PER_UPDATE = 4, 2


def _numpy(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Plain arrays: tensors would travel through shared file descriptors of a finished worker."""
    return {k: v.detach().numpy().copy() for k, v in state.items()}


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in state.items()}


def _setup(stage: int, project: Path | None = None) -> tuple[Any, ...]:
    from hasten import Accelerator
    from hasten.utils import DeepSpeedPlugin, ProjectConfiguration, set_seed

    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(96, 8, generator=generator), torch.randn(96, 2, generator=generator)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    config = None
    if project is not None:
        config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    accelerator = Accelerator(
        gradient_accumulation_steps=STEPS_PER_UPDATE,
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_clipping=1.0),
        project_config=config,
    )
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


def _micro_steps(accelerator: Any, model: Any, optimizer: Any, batches: Any) -> list[float]:
    losses = []
    for x, y in batches:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _first_run(stage: int, folder: str, export: str) -> dict[str, Any]:
    accelerator, model, optimizer, loader, scheduler = _setup(stage)
    batches = iter(loader)
    _micro_steps(accelerator, model, optimizer, [next(batches) for _ in range(4)])
    saved = _numpy(accelerator.get_state_dict(model))
    accelerator.save_state(folder)
    losses = _micro_steps(accelerator, model, optimizer, batches)
    accelerator.save_model(model, export)
    return {
        "saved": saved,
        "losses": losses,
        "final": _numpy(accelerator.get_state_dict(model)),
        "lr": scheduler.get_last_lr(),
    }


def _resumed_run(stage: int, folder: str) -> dict[str, Any]:
    accelerator, model, optimizer, loader, scheduler = _setup(stage)
    accelerator.load_state(folder)
    losses = _micro_steps(accelerator, model, optimizer, loader)  # resumes mid-epoch
    final = _numpy(accelerator.get_state_dict(model))
    # DeepSpeed's own consolidation of the saved ZeRO-3 partitions (one process, no group);
    # done here so the test process itself never imports deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    merged = get_fp32_state_dict_from_zero_checkpoint(folder, tag="pytorch_model")
    lr = scheduler.get_last_lr()
    return {"losses": losses, "final": final, "lr": lr, "merged": _numpy(merged)}


def test_zero3_exact_resume_and_consolidated_weights_in_a_plain_model(tmp_path: Path) -> None:
    folder, export = str(tmp_path / "ckpt"), str(tmp_path / "export")
    first = run_distributed(_first_run, 3, folder, export, world_size=2, timeout=240)
    second = run_distributed(_resumed_run, 3, folder, world_size=2, timeout=240)
    for rank in range(2):
        assert second[rank]["losses"] == first[rank]["losses"]  # bitwise
        assert second[rank]["lr"] == first[rank]["lr"]
    final = _tensors(first[0]["final"])
    for key, value in final.items():
        assert torch.equal(torch.from_numpy(second[0]["final"][key]), value), key
    manifest = (Path(folder) / "hasten_manifest.json").read_text()
    assert "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt" in manifest
    # the export is plain safetensors of the gathered weights, loadable without any engine
    from safetensors.torch import load_file

    plain = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    plain.load_state_dict(load_file(os.path.join(export, "model.safetensors")))
    for key, value in plain.state_dict().items():
        assert torch.equal(value, final[key])
    plain.load_state_dict(_tensors(second[0]["merged"]))
    saved = _tensors(first[0]["saved"])
    for key, value in plain.state_dict().items():
        assert torch.equal(value, saved[key])


def _train_then_die(project: Path, weights_file: Path) -> None:  # pragma: no cover - subprocess
    accelerator, model, optimizer, loader, _ = _setup(2, project)
    batches = iter(loader)
    _micro_steps(accelerator, model, optimizer, [next(batches) for _ in range(4)])
    torch.save(accelerator.get_state_dict(model), weights_file)
    accelerator.save_state()  # checkpoint_0
    _micro_steps(accelerator, model, optimizer, [next(batches) for _ in range(2)])
    strategy = accelerator.strategy
    original = strategy.save_checkpoint

    def save_then_die(folder: Path, files: Any = None) -> None:
        original(folder, files)  # the engine's files are on disk; hasten has not published yet
        os.kill(os.getpid(), signal.SIGKILL)

    strategy.save_checkpoint = save_then_die  # type: ignore[method-assign]
    accelerator.save_state()  # checkpoint_1: killed halfway


def _load_newest(project: str) -> dict[str, Any]:
    accelerator, model, *_ = _setup(2, Path(project))
    accelerator.load_state()
    return _numpy(accelerator.get_state_dict(model))


def test_kill_9_during_save_state_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    weights_file = tmp_path / "weights.pt"
    here = Path(__file__).parent
    code = (
        f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n"
        "from pathlib import Path\nimport test_deepspeed_checkpoint as t\n"
        f"t._train_then_die(Path({str(tmp_path)!r}), Path({str(weights_file)!r}))\n"
    )
    # a fresh interpreter: forking this (threaded) test process could deadlock the child
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "checkpoint_0" / "hasten_manifest.json").is_file()
    assert not (checkpoints / "checkpoint_1").exists()
    (staging,) = checkpoints.glob(".checkpoint_1.*.partial")  # named after the save
    assert (staging / "pytorch_model").is_dir()  # never published
    (loaded,) = run_distributed(_load_newest, str(tmp_path), world_size=1, timeout=240)
    expected = torch.load(weights_file)
    for key, value in expected.items():
        assert torch.equal(torch.from_numpy(loaded[key]), value), key


def _count_reads(folder: str, counts: dict[str, int], load: Any) -> None:
    """Run ``load``, counting in ``counts`` each engine file of ``folder`` it opened (or
    torch.load-ed by path), and under "torch.load" every torch.load call."""
    import builtins
    import io

    root = os.path.realpath(folder)

    def note(path: Any) -> None:
        if isinstance(path, (str, os.PathLike)):
            name = os.path.relpath(os.path.realpath(os.fspath(path)), root)
            if not name.startswith(os.pardir) and os.sep in name:  # inside a tag folder
                counts[name] = counts.get(name, 0) + 1

    real_open, real_os_open, real_load = builtins.open, os.open, torch.load

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        note(file)
        return real_open(file, *args, **kwargs)

    def counting_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        note(path)
        return real_os_open(path, *args, **kwargs)

    def counting_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        note(f)
        counts["torch.load"] = counts.get("torch.load", 0) + 1
        return real_load(f, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        for owner in (builtins, io):
            patch.setattr(owner, "open", counting_open)
        patch.setattr(os, "open", counting_os_open)
        patch.setattr(torch, "load", counting_load)
        load()


def _reload_once_then_refuse_damage(folder: str) -> dict[str, Any]:
    """ZeRO-2: save, train on, load_state (counting file reads), train again; then damage a
    file only process 1's engine reads and load again."""
    from hasten.checkpointing.storage.manifest import CorruptCheckpointError
    from hasten.state import PartialState

    accelerator, model, optimizer, loader, _ = _setup(2)
    batches = iter(loader)
    _micro_steps(accelerator, model, optimizer, [next(batches) for _ in range(4)])
    accelerator.save_state(folder)
    after_save = _micro_steps(accelerator, model, optimizer, [next(batches) for _ in range(4)])
    reads: dict[str, int] = {}
    _count_reads(folder, reads, lambda: accelerator.load_state(folder))
    reads.pop("torch.load", None)
    resumed = iter(loader)  # at the saved position again
    after_load = _micro_steps(accelerator, model, optimizer, [next(resumed) for _ in range(4)])
    accelerator.wait_for_everyone()
    if PartialState().is_main_process:
        target = Path(folder) / "pytorch_model" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    accelerator.wait_for_everyone()
    refused_reads: dict[str, int] = {}
    with pytest.raises(CorruptCheckpointError) as refused:
        _count_reads(folder, refused_reads, lambda: accelerator.load_state(folder))
    return {
        "after_save": after_save,
        "after_load": after_load,
        "reads": reads,
        "refused": str(refused.value),
        "parsed_when_refused": refused_reads.get("torch.load", 0),
    }


def test_load_state_reads_each_engine_file_once_and_refuses_a_damaged_one_everywhere(
    tmp_path: Path,
) -> None:
    folder = str(tmp_path / "ckpt")
    runs = run_distributed(_reload_once_then_refuse_damage, folder, world_size=2, timeout=240)
    for rank, run in enumerate(runs):
        assert run["after_load"] == run["after_save"]  # bitwise: ZeRO-2 state restored exactly
        # each file the engine needs is read once, by the process that needs it, no other file
        assert run["reads"] == {
            os.path.join("pytorch_model", "mp_rank_00_model_states.pt"): 1,
            os.path.join("pytorch_model", f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"): 1,
        }
        # only process 1 reads the damaged file; both refuse it, naming it, before parsing any
        assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in run["refused"]
        assert run["parsed_when_refused"] == 0


def _failing_serializer(obj: Any, handle: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _async_mid_cycle_and_failing_saves(root: str) -> dict[str, Any]:
    """ZeRO-3: an asynchronous save, a save mid-cycle, a save one process cannot write."""
    from hasten.state import PartialState

    accelerator, model, optimizer, loader, _ = _setup(3)
    rank = PartialState().process_index
    batches = iter(loader)
    _micro_steps(accelerator, model, optimizer, [next(batches) for _ in range(4)])
    writer = accelerator.strategy.engines[0].checkpoint_engine
    written = threading.Event()

    def after_training_went_on(obj: Any, handle: Any) -> None:
        written.wait(120)  # the files are written only once training changed the state
        type(writer)._serialize(writer, obj, handle)

    writer._serialize = after_training_went_on
    accelerator.save_state(os.path.join(root, "async"), async_save=True)
    del writer._serialize
    # training goes on while the checkpoint is written; it must hold the state at the call
    after_async = _micro_steps(accelerator, model, optimizer, [next(batches) for _ in range(4)])
    written.set()
    _micro_steps(accelerator, model, optimizer, [next(batches)])  # mid-cycle now
    with pytest.warns(RuntimeWarning, match="middle of a DeepSpeed accumulation cycle"):
        accelerator.save_state(os.path.join(root, "mid"))
    after_mid = _micro_steps(accelerator, model, optimizer, [next(batches)])
    engine = accelerator.strategy.engines[0]
    if rank == 1:  # one process cannot write its ZeRO partition
        engine.checkpoint_engine._serialize = _failing_serializer
    with pytest.raises((OSError, RuntimeError)) as failed:
        accelerator.save_state(os.path.join(root, "failed"))
    published = os.path.exists(os.path.join(root, "failed"))
    engine.checkpoint_engine.__dict__.pop("_serialize", None)
    accelerator.save_state(os.path.join(root, "failed"))  # the next save works
    return {
        "after_async": after_async,
        "after_mid": after_mid,
        "failure": str(failed.value),
        "published_after_failure": published,
    }


def _resume_from(folder: str, micro_steps: int) -> dict[str, Any]:
    accelerator, model, optimizer, loader, _ = _setup(3)
    accelerator.load_state(folder)
    batches = iter(loader)  # resumes at the saved position
    losses = _micro_steps(accelerator, model, optimizer, [next(batches)])
    boundary = accelerator.sync_gradients
    losses += _micro_steps(
        accelerator, model, optimizer, [next(batches) for _ in range(micro_steps - 1)]
    )
    return {"losses": losses, "boundary": boundary}


def test_async_save_mid_cycle_save_and_a_failed_engine_write(tmp_path: Path) -> None:
    root = str(tmp_path)
    first = run_distributed(_async_mid_cycle_and_failing_saves, root, world_size=2, timeout=240)
    for rank in range(2):
        assert not first[rank]["published_after_failure"]
    assert "No space left on device" in first[1]["failure"]
    assert "Process 1 could not write its part" in first[0]["failure"]
    assert not list(tmp_path.glob(".failed*"))  # the failed save's staging folder is gone
    assert (tmp_path / "failed" / "hasten_manifest.json").is_file()
    manifest = (tmp_path / "async" / "hasten_manifest.json").read_text()
    for name in ("zero_pp_rank_1_mp_rank_00_optim_states.pt", "latest", "zero_to_fp32.py"):
        assert name in manifest
    resumed = run_distributed(_resume_from, str(tmp_path / "async"), 4, world_size=2, timeout=240)
    for rank in range(2):  # the asynchronous checkpoint is the state when save_state was called
        assert resumed[rank]["losses"] == first[rank]["after_async"]
    mid = run_distributed(_resume_from, str(tmp_path / "mid"), 1, world_size=2, timeout=240)
    for rank in range(2):  # same weights, and the cycle's boundary where it was
        assert mid[rank]["losses"] == first[rank]["after_mid"]
        assert mid[rank]["boundary"] is True

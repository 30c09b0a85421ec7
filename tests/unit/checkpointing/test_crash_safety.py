"""kill -9 during save_state, many times: the newest complete checkpoint always loads and resumes.

A forked child resumes from the newest complete checkpoint (``load_state()`` without a folder)
and then alternates one training step with one automatic save, forever; the parent kills it with
SIGKILL after a random delay spread over a few saves. After every kill the parent checks that
every ``checkpoint_<i>`` folder is complete (the rename is atomic), that nothing complete before
the trial was lost, and that the newest checkpoint holds exactly the state after its step count
and trains on exactly as an uninterrupted run does. A full disk mid-save leaves the previous
checkpoints intact and raises a clear error.
"""

from __future__ import annotations

import errno
import gc
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.checkpointing import CheckpointContents, CheckpointManager
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage import writer as writer_module
from hasten.config.project import ProjectConfiguration
from hasten.state._shared import reset_state

TRIALS = 24
EXTRA_OBJECTS = 12  # many small files make a save long enough to be hit in the middle


class Steps:
    """Training steps done so far, checkpointed as a registered object."""

    def __init__(self) -> None:
        self.done = 0

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.done = int(state["done"])


class Tag:
    """A small registered object: one more file in every checkpoint."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["value"] != self.value:
            raise ValueError(f"tag {state['value']} != {self.value}")


def _setup(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Steps, list[Any]]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, Steps(), [Tag(i) for i in range(EXTRA_OBJECTS)]


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: Steps) -> None:
    data = torch.Generator().manual_seed(steps.done)  # the data of step n depends on n only
    x = torch.randn(8, 64, generator=data)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    steps.done += 1


def _contents(model: Any, optimizer: Any, steps: Steps, tags: list[Any]) -> CheckpointContents:
    return CheckpointContents(
        model_states=[model.state_dict()],
        models=[model],
        optimizers=[optimizer],
        custom_objects=[steps, *tags],
    )


def _manager(project: Path) -> CheckpointManager:
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    return CheckpointManager(config)


def _train_and_save_forever(project: Path, ready: int) -> None:
    """The child: resume from the newest complete checkpoint, then step and save in a loop."""
    torch.set_num_threads(1)  # the parent's OpenMP pool does not survive fork
    gc.freeze()  # the child's collections skip the objects it inherited (no copy-on-write scans)
    reset_state()
    model, optimizer, steps, tags = _setup(seed=os.getpid())
    manager = _manager(project)
    if paths.newest_complete_checkpoint(project) is not None:
        manager.load_state(None, _contents(model, optimizer, steps, tags))
    os.write(ready, b"1")
    while True:
        _step(model, optimizer, steps)
        manager.save_state(None, _contents(model, optimizer, steps, tags), [model], step=0)


class Reference:
    """The uninterrupted run's weights after each step, trained only as far as a check asks."""

    def __init__(self) -> None:
        self.model, self.optimizer, self.steps, _ = _setup(seed=0)
        self.weights = [self._snapshot()]

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}

    def __getitem__(self, step: int) -> dict[str, torch.Tensor]:
        while len(self.weights) <= step:
            _step(self.model, self.optimizer, self.steps)
            self.weights.append(self._snapshot())
        return self.weights[step]


def _kill_during_saves(project: Path, delay: float) -> None:
    """Fork the child; once it has resumed and entered its loop, SIGKILL it after ``delay``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns normally
        try:
            os.close(read_end)
            _train_and_save_forever(project, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        assert ready.read(1) == b"1", "the child failed before its save loop"
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), "the child died on its own: see its error above"


def _check_newest(project: Path, reference: Reference) -> int:
    """Load the newest complete checkpoint; its state is exactly the reference's; return steps."""
    model, optimizer, steps, tags = _setup(seed=123)
    manager = _manager(project)
    manager.load_state(None, _contents(model, optimizer, steps, tags))
    for key, value in model.state_dict().items():
        assert torch.equal(value, reference[steps.done][key]), (steps.done, key)
    _step(model, optimizer, steps)  # and it trains on exactly like the uninterrupted run
    for key, value in model.state_dict().items():
        assert torch.equal(value, reference[steps.done][key]), (steps.done, key)
    return steps.done


@pytest.mark.timeout(120)
def test_kill_9_during_save_never_loses_a_checkpoint(tmp_path: Path) -> None:
    project = tmp_path / "project"
    model, optimizer, steps, tags = _setup(seed=0)
    manager = _manager(project)
    began = time.perf_counter()
    manager.save_state(None, _contents(model, optimizer, steps, tags), [model], step=0)
    save_time = time.perf_counter() - began
    reference = Reference()
    rng = random.Random(0)
    mid_save, done = 0, 0
    for _ in range(TRIALS):
        before = {n for n, _ in paths.complete_checkpoints(project)}
        # Any moment of the first two saves (or the step between them) is a target.
        _kill_during_saves(project, rng.uniform(0, 2 * save_time))
        root = project / "checkpoints"
        mid_save += any(p.name.endswith(".partial") for p in root.iterdir())
        complete = {n for n, _ in paths.complete_checkpoints(project)}
        numbered = {paths.checkpoint_number(p) for p in root.iterdir()} - {None}
        assert numbered == complete, "a checkpoint_<i> folder exists but is incomplete"
        assert before <= complete, f"lost checkpoints: {sorted(before - complete)}"
        newest = _check_newest(project, reference)
        assert newest >= done
        done = newest
    assert done > 0
    assert mid_save >= TRIALS // 4, f"only {mid_save} kills landed inside a save"


def test_full_disk_mid_save_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    model, optimizer, steps, tags = _setup(seed=0)
    manager = _manager(project)
    manager.save_state(None, _contents(model, optimizer, steps, tags), [model], step=0)
    _step(model, optimizer, steps)
    real = writer_module._write_job
    calls = {"n": 0}

    def fill_up(folder: Path, job: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / job.name))
        return real(folder, job)

    monkeypatch.setattr(writer_module, "_write_job", fill_up)
    with pytest.raises(OSError, match="No space left on device.*checkpoint_1.*not published"):
        manager.save_state(None, _contents(model, optimizer, steps, tags), [model], step=0)
    monkeypatch.setattr(writer_module, "_write_job", real)
    root = project / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_0"]  # no staging left behind
    reference = Reference()
    assert _check_newest(project, reference) == 1
    # The next save reuses the number that failed.
    manager.save_state(None, _contents(model, optimizer, steps, tags), [model], step=0)
    assert (root / "checkpoint_1").is_dir()

"""Preemption: a signal sets a flag; the next batch boundary checkpoints and exits with code 75."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from hasten import Accelerator
from hasten.checkpointing.preemption import (
    PREEMPTED_EXIT_CODE,
    PreemptionWatcher,
    active_watcher,
)
from hasten.config.project import ProjectConfiguration
from hasten.data_loader.base import ResumableDataLoader
from hasten.state._shared import reset_state


@pytest.fixture(autouse=True)
def _fresh_state() -> None:
    reset_state()
    yield
    reset_state()


def test_signal_then_boundary_saves_once_and_exits_75() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    saved: list[int] = []
    watcher = PreemptionWatcher(lambda: str(saved.append(1) or "folder"))
    assert watcher.install()
    hook = ResumableDataLoader.batch_boundary_hook
    assert hook is not None
    assert active_watcher() is watcher
    hook()  # no signal yet: nothing happens
    assert saved == []
    os.kill(os.getpid(), signal.SIGUSR1)
    assert watcher.requested
    with pytest.raises(SystemExit) as exit_info:
        hook()
    assert exit_info.value.code == PREEMPTED_EXIT_CODE == 75
    assert saved == [1]
    assert ResumableDataLoader.batch_boundary_hook is None  # uninstalled on the way out
    assert signal.getsignal(signal.SIGUSR1) is before
    assert active_watcher() is None


def test_reset_state_retires_the_watcher() -> None:
    before = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher(lambda: "folder")
    watcher.install()
    reset_state()
    assert ResumableDataLoader.batch_boundary_hook is None
    assert signal.getsignal(signal.SIGTERM) is before


def test_accelerator_watches_only_with_automatic_naming(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    Accelerator(cpu=True)
    assert ResumableDataLoader.batch_boundary_hook is None
    if before is signal.SIG_DFL:  # only the warning notice listens (the tests below)
        assert signal.getsignal(signal.SIGTERM) is not before
    reset_state()
    assert signal.getsignal(signal.SIGTERM) is before
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    assert ResumableDataLoader.batch_boundary_hook is not None
    assert signal.getsignal(signal.SIGTERM) is not before
    accelerator.end_training()  # training is over: signals behave as before again
    assert ResumableDataLoader.batch_boundary_hook is None
    assert signal.getsignal(signal.SIGTERM) is before


def test_preempted_loop_checkpoints_after_the_step_and_resumes(tmp_path: Path) -> None:
    def build() -> tuple[Accelerator, DataLoader[torch.Tensor]]:
        reset_state()
        config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
        accelerator = Accelerator(cpu=True, project_config=config)
        loader = DataLoader(torch.arange(12), batch_size=2, shuffle=True)
        return accelerator, accelerator.prepare(loader)

    torch.manual_seed(0)
    accelerator, loader = build()
    reference = [b.tolist() for b in loader]
    torch.manual_seed(0)
    accelerator, loader = build()
    seen = []
    with pytest.raises(SystemExit) as exit_info:
        for batch in loader:
            seen.append(batch.tolist())
            if len(seen) == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # mid-step: the step still finishes
    assert exit_info.value.code == PREEMPTED_EXIT_CODE
    assert seen == reference[:2]
    assert (tmp_path / "checkpoints" / "checkpoint_0" / "hasten_manifest.json").is_file()
    torch.manual_seed(5)
    accelerator, loader = build()
    accelerator.load_state()
    assert [b.tolist() for b in loader] == reference[2:]
    accelerator.end_training()


def test_uneven_shards_get_no_boundary_hook() -> None:
    from hasten.data_loader import prepare_data_loader

    watcher = PreemptionWatcher(lambda: "folder")
    watcher.install()
    loader = DataLoader(list(range(10)), batch_size=2)
    even = prepare_data_loader(loader, num_processes=2, process_index=0)
    uneven = prepare_data_loader(loader, num_processes=2, process_index=0, even_batches=False)
    assert even._boundary_hook() is not None
    # Processes may hold different batch counts: a collective per batch would mismatch.
    assert uneven._boundary_hook() is None
    watcher.uninstall()
    assert even._boundary_hook() is None


_UNSAVED = """
import os, signal, sys
from hasten import Accelerator
accelerator = Accelerator(cpu=True)  # no project_dir / automatic_checkpoint_naming: nothing saves
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("still alive", flush=True)
"""


def test_signal_with_nothing_to_save_warns_then_ends_as_the_signal_would() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _UNSAVED], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "ready" in result.stdout and "still alive" not in result.stdout
    assert "Received SIGTERM" in result.stderr and "no checkpoint will be saved" in result.stderr
    assert "automatic_checkpoint_naming=True" in result.stderr


def test_unsaved_notice_leaves_a_users_handler_alone_and_end_training_restores() -> None:
    def mine(signum: int, frame: object) -> None:
        return None

    before_usr1 = signal.getsignal(signal.SIGUSR1)
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        accelerator = Accelerator(cpu=True)
        assert signal.getsignal(signal.SIGTERM) is mine  # the user's own handler is kept
        assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL  # the notice listens
        accelerator.end_training()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGUSR1, before_usr1)


def test_preemption_watcher_replaces_the_notice(tmp_path: Path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    assert active_watcher() is not None
    assert accelerator._unsaved_notice is None
    accelerator.end_training()

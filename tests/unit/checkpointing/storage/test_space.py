"""A full disk and a read-only folder during save_state: clear errors, nothing published,
earlier checkpoints intact, training goes on (issue 31, bad input)."""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hasten.checkpointing.storage.space import disk_full_error, out_of_space


def _mounted_tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _mounted_tmpfs(tmp_path / "small", "size=6m")


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    yield from _mounted_tmpfs(tmp_path / "ro", "size=1m,ro")


def test_enospc_is_out_of_space(tmp_path: Path) -> None:
    assert out_of_space(tmp_path, OSError(errno.ENOSPC, "full"))
    assert out_of_space(tmp_path, OSError(errno.EDQUOT, "quota"))


def test_other_failures_with_room_left_are_not(tmp_path: Path) -> None:
    assert not out_of_space(tmp_path, RuntimeError("unexpected pos 1472 vs 1364"))
    assert not out_of_space(tmp_path, OSError(errno.EIO, "io"))


def test_disk_full_error_names_folder_free_and_needed_bytes(tmp_path: Path) -> None:
    earlier = tmp_path / "checkpoint_0"
    earlier.mkdir()
    (earlier / "model.safetensors").write_bytes(b"x" * 5000)
    staging = tmp_path / ".checkpoint_1.partial"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"x" * 100)
    error = disk_full_error(tmp_path / "checkpoint_1", staging, "optimizer.bin")
    message = str(error)
    assert error.errno == errno.ENOSPC
    assert str(tmp_path) in message and "optimizer.bin" in message
    assert "about 5000 bytes" in message and str(earlier) in message
    assert "bytes free" in message and "total_limit" in message


def test_disk_full_error_without_an_earlier_checkpoint_counts_what_was_written(
    tmp_path: Path,
) -> None:
    staging = tmp_path / ".c.partial"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"x" * 300)
    assert "more than the 300 bytes" in str(disk_full_error(tmp_path / "c", staging, "m"))


def _prepared(width: int) -> tuple[object, torch.nn.Module, torch.optim.Optimizer]:
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    return accelerator, model, optimizer


def test_full_disk_keeps_the_earlier_checkpoint_and_training_goes_on(small_disk: Path) -> None:
    accelerator, model, optimizer = _prepared(300)  # ~1.1 MB of state
    accelerator.save_state(str(small_disk / "first"))  # type: ignore[attr-defined]
    filler = small_disk / "filler.bin"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * (free - (200 << 10)))  # leave 200 KB: too little for the state
    with pytest.raises(OSError, match="No space left") as caught:
        accelerator.save_state(str(small_disk / "second"))  # type: ignore[attr-defined]
    assert caught.value.errno == errno.ENOSPC
    message = str(caught.value)
    assert str(small_disk) in message and "bytes free" in message
    assert str(small_disk / "first") in message  # the earlier checkpoint's size is the estimate
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler.bin", "first"]
    accelerator.load_state(str(small_disk / "first"))  # type: ignore[attr-defined]
    model(torch.randn(2, 300)).sum().backward()  # training goes on and, with room, saves again
    optimizer.step()
    filler.unlink()
    accelerator.save_state(str(small_disk / "second"))  # type: ignore[attr-defined]
    assert (small_disk / "second").is_dir()


def test_read_only_folder_names_the_fix(read_only: Path) -> None:
    accelerator, _, _ = _prepared(8)
    with pytest.raises(OSError, match="cannot be written by this process") as caught:
        accelerator.save_state(str(read_only / "ckpt"))  # type: ignore[attr-defined]
    assert "project_dir" in str(caught.value)
    assert list(read_only.iterdir()) == []

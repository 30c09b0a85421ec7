"""Where checkpoint files go: Accelerate's file names, `checkpoint_<i>` folders, retention.

The file names are Accelerate's (``model.safetensors``, ``optimizer.bin``, ``random_states_0.pkl``,
...) so tools that know its layout can read a hasten checkpoint.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path

from hasten.checkpointing.storage.io import fsync_directory
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, read_manifest
from hasten.checkpointing.storage.threads import io_threads
from hasten.core.constants import (
    FSDP_MODEL_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)

__all__ = [
    "CHECKPOINT_PREFIX",
    "checkpoint_number",
    "checkpoint_path",
    "complete_checkpoints",
    "custom_object_file",
    "dataloader_state_file",
    "gradients_file",
    "model_file",
    "newest_complete_checkpoint",
    "optimizer_file",
    "prune_checkpoints",
    "publish",
    "remove_stale_staging",
    "rng_file",
    "sampler_file",
    "scaler_file",
    "scheduler_file",
    "sharded_model_dir",
    "sharded_optimizer_dir",
    "staging_path",
    "wait_for_removals",
]

CHECKPOINT_PREFIX = "checkpoint_"
_NUMBERED = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


def _indexed(stem: str, index: int, suffix: str) -> str:
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def model_file(index: int, safe_serialization: bool) -> str:
    """``model.safetensors`` / ``model_1.safetensors``, or the ``pytorch_model.bin`` family."""
    if safe_serialization:
        return _indexed(SAFE_MODEL_NAME, index, ".safetensors")
    return _indexed(MODEL_NAME, index, ".bin")


def optimizer_file(index: int) -> str:
    """``optimizer.bin`` / ``optimizer_1.bin``."""
    return _indexed(OPTIMIZER_NAME, index, ".bin")


def scheduler_file(index: int) -> str:
    """``scheduler.bin`` / ``scheduler_1.bin``."""
    return _indexed(SCHEDULER_NAME, index, ".bin")


def sampler_file(index: int) -> str:
    """``sampler.bin`` / ``sampler_1.bin``."""
    return _indexed(SAMPLER_NAME, index, ".bin")


def dataloader_state_file(index: int) -> str:
    """``dl_state_dict.bin`` / ``dl_state_dict_1.bin``: position and shuffle state of a loader."""
    return _indexed("dl_state_dict", index, ".bin")


def scaler_file() -> str:
    """``scaler.pt``."""
    return SCALER_NAME


def rng_file(process_index: int) -> str:
    """``random_states_<rank>.pkl``: one per process."""
    return f"{RNG_STATE_NAME}_{process_index}.pkl"


def custom_object_file(index: int) -> str:
    """``custom_checkpoint_<i>.pkl`` for objects given to `register_for_checkpointing`."""
    return f"custom_checkpoint_{index}.pkl"


def gradients_file(model_index: int, process_index: int) -> str:
    """``gradients_<model>_<rank>.safetensors``: gradients accumulated mid-cycle, per process."""
    return f"gradients_{model_index}_{process_index}.safetensors"


def sharded_model_dir(index: int) -> str:
    """``pytorch_model_fsdp_<index>``: model ``index``'s DCP folder (Accelerate's name)."""
    return f"{FSDP_MODEL_NAME}_{index}"


def sharded_optimizer_dir(index: int) -> str:
    """``optimizer_<index>``: optimizer ``index``'s DCP folder (Accelerate's name)."""
    return f"{OPTIMIZER_NAME}_{index}"


def checkpoint_path(project_dir: str | os.PathLike[str], iteration: int) -> Path:
    """``<project_dir>/checkpoints/checkpoint_<iteration>`` (automatic checkpoint naming)."""
    return Path(project_dir) / "checkpoints" / f"{CHECKPOINT_PREFIX}{iteration}"


def staging_path(final: Path, token: str = "") -> Path:
    """The hidden sibling a checkpoint is written into before it is renamed into place.

    ``token`` names the save (`hasten.checkpointing.storage.agreement.next_token`), so a folder a
    crashed save left is never written into again; `remove_stale_staging` removes it.
    """
    middle = f".{token}" if token else ""
    return final.parent / f".{final.name}{middle}.partial"


def remove_stale_staging(final: Path) -> None:
    """Remove the staging folders crashed saves to ``final`` left behind (after a publish)."""
    stale = re.compile(rf"^\.{re.escape(final.name)}(\.[0-9a-f]+)?\.partial$")
    for entry in os.scandir(final.parent):
        if stale.match(entry.name):
            shutil.rmtree(entry.path, ignore_errors=True)


_REMOVALS: dict[Path, Future[None]] = {}
_REMOVALS_LOCK = threading.Lock()


def _remove_in_background(path: Path) -> None:
    removal = io_threads().submit(shutil.rmtree, path, ignore_errors=True)
    with _REMOVALS_LOCK:
        _REMOVALS[path] = removal


def _forget_removals() -> None:
    global _REMOVALS_LOCK
    _REMOVALS.clear()  # a forked child: those removals run (and finish) in the parent
    _REMOVALS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_removals)


def _wait_for_removal(path: Path) -> None:
    with _REMOVALS_LOCK:
        removal = _REMOVALS.pop(path, None)
    if removal is not None:
        removal.result()


def wait_for_removals() -> None:
    """Wait until the folders `publish` replaced are deleted (``end_training`` does)."""
    with _REMOVALS_LOCK:
        paths = list(_REMOVALS)
    for path in paths:
        _wait_for_removal(path)


def publish(staging: Path, final: Path) -> None:
    """Rename a finished staging folder to ``final``, replacing an older folder of that name.

    The older folder is moved aside first and deleted only after the new one is in place (on a
    background thread: freeing a large checkpoint's blocks takes a while, and nothing needs to
    wait for it but the next publish to the same name), so a crash at any moment leaves one
    complete checkpoint under ``final`` or beside it.
    """
    aside = final.parent / f".{final.name}.old"
    _wait_for_removal(aside)
    if aside.exists():
        shutil.rmtree(aside)
    if final.exists():
        os.replace(final, aside)
    os.replace(staging, final)
    fsync_directory(final.parent)
    if aside.exists():
        _remove_in_background(aside)


def checkpoint_number(folder: Path) -> int | None:
    """The ``<i>`` of a ``checkpoint_<i>`` folder, or None for any other name."""
    match = _NUMBERED.match(folder.name)
    return int(match.group(1)) if match else None


def complete_checkpoints(project_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Numbered checkpoints under ``<project_dir>/checkpoints`` whose manifest checks out."""
    root = Path(project_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _NUMBERED.match(entry.name)
        if not match or not entry.is_dir():
            continue
        try:
            read_manifest(entry)
        except CorruptCheckpointError:
            continue
        found.append((int(match.group(1)), entry))
    return sorted(found)


def newest_complete_checkpoint(project_dir: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest number, skipping partial or damaged ones."""
    found = complete_checkpoints(project_dir)
    return found[-1][1] if found else None


def prune_checkpoints(project_dir: str | os.PathLike[str], total_limit: int) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``total_limit``; return what was removed."""
    if total_limit <= 0:
        raise ValueError(
            f"total_limit must be a positive number of checkpoints, got {total_limit}."
        )
    found = complete_checkpoints(project_dir)
    doomed = [path for _, path in found[: max(0, len(found) - total_limit)]]
    for path in doomed:
        shutil.rmtree(path)
    return doomed

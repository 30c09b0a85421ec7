"""Merge a sharded (DCP) checkpoint into one model file, in one process, without a process group.

The DCP ``.metadata`` records every tensor's full shape and dtype, so the merge allocates each
tensor whole and lets DCP fill it from the shards (whatever number of processes saved them).
A checkpoint whose tensors all sit under one top-level key (``{"model": state_dict}``, as
sharded FSDP saves write) gives that inner state dict. Non-tensor entries are left out.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from hasten.checkpointing.dcp_folders import SHARDED_METADATA, is_sharded_checkpoint
from hasten.checkpointing.storage.io import save
from hasten.core.constants import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from hasten.state import PartialState

__all__ = ["load_merged_state_dict", "merge_on_main_process", "merge_sharded_checkpoint"]


def _strip_single_root(state: dict[str, Any], paths: dict[str, Any]) -> dict[str, Any]:
    """Drop the top-level key when every tensor sits under the same one."""
    roots = {tuple(paths.get(key, (key,)))[0] for key in state}
    if len(roots) != 1 or not all(len(tuple(paths.get(key, (key,)))) > 1 for key in state):
        return state
    return {
        ".".join(str(part) for part in tuple(paths[key])[1:]): value for key, value in state.items()
    }


def load_merged_state_dict(checkpoint_dir: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read every tensor of the sharded checkpoint at `checkpoint_dir` into full CPU tensors.

    Raises:
        FileNotFoundError: `checkpoint_dir` is not a complete sharded checkpoint.
        UnsafeCheckpointError: its ``.metadata`` holds objects that could run code when loaded.
    """
    folder = Path(checkpoint_dir)
    if not is_sharded_checkpoint(folder):
        raise FileNotFoundError(
            f"{str(folder)!r} is not a complete sharded checkpoint ({SHARDED_METADATA} is "
            "missing). Pass the folder holding the .distcp files and .metadata, e.g. "
            "checkpoints/checkpoint_0/pytorch_model_fsdp_0."
        )
    # deferred: these load the DCP machinery
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from hasten.checkpointing.storage.dcp import load_folder
    from hasten.checkpointing.storage.dcp_safe import SafeFileSystemReader

    metadata = SafeFileSystemReader(folder).read_metadata()
    state: dict[str, Any] = {}
    for key, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            state[key] = torch.empty(item.size, dtype=item.properties.dtype)
    load_folder(state, folder, no_dist=True)  # verified against its manifest, if it has one
    paths = dict(getattr(metadata, "planner_data", None) or {})
    return _strip_single_root(state, paths)


def merge_sharded_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path:
    """Write the sharded checkpoint at `checkpoint_dir` as one model file in `output_path`.

    Args:
        checkpoint_dir: the sharded checkpoint folder.
        output_path: folder for ``model.safetensors`` (``pytorch_model.bin`` when not safe).
        safe_serialization: write safetensors (default) instead of a pickle.
        remove_checkpoint_dir: delete `checkpoint_dir` once the merged file is written.

    Returns:
        The path of the merged file.

    Raises:
        FileNotFoundError: `checkpoint_dir` is not a complete sharded checkpoint.
        ValueError: `output_path` is inside `checkpoint_dir` while asked to remove it.
    """
    source = Path(checkpoint_dir).resolve()
    target_dir = Path(output_path).resolve()
    if remove_checkpoint_dir and (target_dir == source or source in target_dir.parents):
        raise ValueError(
            f"output_path {str(target_dir)!r} is inside checkpoint_dir {str(source)!r}, which "
            "remove_checkpoint_dir would delete. Write the merged model somewhere else."
        )
    state = load_merged_state_dict(source)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    save(state, target, safe_serialization=safe_serialization)
    if remove_checkpoint_dir:
        shutil.rmtree(source)
    return target


def merge_on_main_process(
    checkpoint_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path:
    """`merge_sharded_checkpoint` called by every process of a job: the main process merges, the
    others wait for it, so each can read the merged file once this returns (as Accelerate's
    ``merge_fsdp_weights``). Returns the merged file's path on every process."""
    state = PartialState()
    target = Path(output_path).resolve() / (
        SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME
    )
    if state.is_main_process:
        target = merge_sharded_checkpoint(
            checkpoint_dir, output_path, safe_serialization, remove_checkpoint_dir
        )
    state.wait_for_everyone()
    return target

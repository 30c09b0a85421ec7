"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP): each process writes its part.

For models too large for one process to gather (FSDP, tensor parallelism), every process
writes only the shards it owns (``__<rank>_0.distcp``) and the coordinator writes DCP's
``.metadata``, which records where every piece of every tensor lives. Loading reads that map,
so a checkpoint saved by N processes loads on M processes (or on one, into full tensors):
DCP reshards while reading.

As with `save_accelerator_state`, the files go into a hidden staging folder that is renamed
into place only after every process has finished, so a crash never leaves a folder that looks
complete; `is_sharded_checkpoint` recognises a finished one.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hasten.checkpointing.storage import paths
from hasten.state import PartialState

__all__ = [
    "SHARDED_METADATA",
    "full_tensor",
    "is_sharded_checkpoint",
    "load_sharded_state",
    "save_sharded_state",
]

SHARDED_METADATA = ".metadata"  # written by DCP's coordinator once every part is on disk


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and PartialState().num_processes > 1


def is_sharded_checkpoint(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a complete sharded (DCP) checkpoint."""
    return (Path(folder) / SHARDED_METADATA).is_file()


def save_sharded_state(
    state_dict: dict[str, Any], output_dir: str | os.PathLike[str], *, process_group: Any = None
) -> Path:
    """Write ``state_dict`` as a sharded checkpoint; every process calls it together.

    Tensors may be plain (replicated: written once), ``DTensor`` or sharded tensors (each
    process writes the shards it holds). Nested dicts (e.g. optimizer states) are fine.

    Returns:
        The final folder, published once every process has written its part.
    """
    state = PartialState()
    final = Path(output_dir).absolute()
    staging = paths.staging_path(final)
    distributed = _distributed()
    if state.is_main_process:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    state.wait_for_everyone()
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(
            state_dict,
            checkpoint_id=staging,
            process_group=process_group,
            no_dist=not distributed,
        )
    state.wait_for_everyone()  # every part and the metadata are on disk
    if state.is_main_process:
        paths.publish(staging, final)
    state.wait_for_everyone()
    return final


def load_sharded_state(
    state_dict: dict[str, Any], input_dir: str | os.PathLike[str], *, process_group: Any = None
) -> dict[str, Any]:
    """Fill ``state_dict`` (tensors of the wanted shapes and layouts) from a sharded checkpoint.

    Each process reads only the pieces its tensors need, whatever number of processes saved.

    Raises:
        FileNotFoundError: ``input_dir`` is not a complete sharded checkpoint.
    """
    folder = Path(input_dir)
    if not is_sharded_checkpoint(folder):
        raise FileNotFoundError(
            f"No complete sharded checkpoint at {folder} ({SHARDED_METADATA} is missing). Pass "
            "the folder that save_sharded_state returned."
        )
    from hasten.checkpointing.storage.dcp_safe import safe_load

    with warnings.catch_warnings():  # DCP warns that one process means no process group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        safe_load(state_dict, folder, process_group=process_group, no_dist=not _distributed())
    return state_dict


def full_tensor(value: Any) -> torch.Tensor:
    """A plain tensor for ``value`` (gathering a DTensor), for comparisons and exports."""
    to_full = getattr(value, "full_tensor", None)
    return to_full() if callable(to_full) else value

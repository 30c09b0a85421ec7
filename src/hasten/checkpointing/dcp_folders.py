"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP): each process writes its part.

For models too large for one process to gather (FSDP, tensor parallelism), every process
writes only the shards it owns (``__<rank>_0.distcp``) and the coordinator writes DCP's
``.metadata``, which records where every piece of every tensor lives. Loading reads that map,
so a checkpoint saved by N processes loads on M processes (or on one, into full tensors):
DCP reshards while reading.

The folder is written as save_state's are (`hasten.checkpointing.storage.dcp.save_folder`):
into a hidden staging folder, every file hashed while written and listed in the folder's
manifest, then renamed into place once every process has finished, so a crash never leaves a
folder that looks complete; `is_sharded_checkpoint` recognises a finished one, and a load
verifies every file it reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SHARDED_METADATA",
    "full_tensor",
    "is_sharded_checkpoint",
    "load_sharded_state",
    "save_sharded_state",
]

SHARDED_METADATA = ".metadata"  # written by DCP's coordinator once every part is on disk


def is_sharded_checkpoint(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a complete sharded (DCP) checkpoint."""
    return (Path(folder) / SHARDED_METADATA).is_file()


def save_sharded_state(
    state_dict: dict[str, Any], output_dir: str | os.PathLike[str], *, process_group: Any = None
) -> Path:
    """Write ``state_dict`` as a sharded checkpoint; every process calls it together.

    Tensors may be plain (replicated: written once), ``DTensor`` or sharded tensors (each
    process writes the shards it holds). Nested dicts (e.g. optimizer states) are fine. Every
    process must see the same folder.

    Returns:
        The final folder, published once every process has written its part.

    Raises:
        FolderNotSharedError: the processes do not all see ``output_dir`` (nothing is written).
        ValueError: ``process_group`` is a subgroup; every process of the run saves together.
    """
    from hasten.checkpointing.storage.dcp import save_folder

    return save_folder(state_dict, output_dir, process_group=process_group)


def load_sharded_state(
    state_dict: dict[str, Any], input_dir: str | os.PathLike[str], *, process_group: Any = None
) -> dict[str, Any]:
    """Fill ``state_dict`` (tensors of the wanted shapes and layouts) from a sharded checkpoint.

    Each process reads only the pieces its tensors need, whatever number of processes saved.
    The files are verified against the folder's manifest (a DCP folder another tool wrote,
    without one, is read through the restricted readers alone).

    Raises:
        FileNotFoundError: ``input_dir`` is not a complete sharded checkpoint.
        CorruptCheckpointError: a file it reads is damaged, missing or not listed.
    """
    folder = Path(input_dir)
    if not is_sharded_checkpoint(folder):
        raise FileNotFoundError(
            f"No complete sharded checkpoint at {folder} ({SHARDED_METADATA} is missing). Pass "
            "the folder that save_sharded_state returned."
        )
    from hasten.checkpointing.storage.dcp import load_folder

    return load_folder(state_dict, folder, process_group=process_group)


def full_tensor(value: Any) -> torch.Tensor:
    """A plain tensor for ``value`` (gathering a DTensor), for comparisons and exports."""
    to_full = getattr(value, "full_tensor", None)
    return to_full() if callable(to_full) else value

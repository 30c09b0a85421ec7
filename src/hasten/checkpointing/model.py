"""save_model: a model's weights as one file or size-capped shards plus an index, atomically.

Tied weights are written once (safetensors refuses shared storage; a pickle keeps the sharing);
sharded engines mark a tie by one object under several names, as the gathered full tensors no
longer share memory.
Shards are serialized one at a time, so the extra memory is at most one shard. Sharded models
(FSDP2) are planned from the tensors as held, whose shapes are the full ones, and gathered one
shard at a time (``gather``): the main process never holds more than one shard of full tensors.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, cast

import torch

from hasten.checkpointing.storage.io import atomic_write
from hasten.checkpointing.storage.tensors import dedupe_shared_tensors, write_safetensors
from hasten.config.parallelism import ParallelismConfig
from hasten.core.constants import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from hasten.core.units import convert_file_size_to_int

__all__ = ["plan_shards", "save_model_weights", "saves_model_in_mesh", "state_dict_to_save"]

logger = logging.getLogger(__name__)


def state_dict_to_save(
    model: torch.nn.Module, get_state_dict: Callable[[torch.nn.Module], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The weights `save_model` writes: offloaded ones (dispatch hooks) onloaded module by module,
    else ``get_state_dict(model)``.

    Raises:
        RuntimeError: parameters on the meta device without offload hooks (Accelerate's words).
    """
    from hasten.big_modeling.onload import get_state_dict_offloaded_model, has_offloaded_params

    if any(has_offloaded_params(module) for module in model.modules()):
        return get_state_dict_offloaded_model(model)
    if any(param.device.type == "meta" for param in model.parameters()):
        raise RuntimeError(
            "You can't save the model since some parameters are on the meta device. (hasten: "
            "load its weights first, e.g. with load_checkpoint_and_dispatch.)"
        )
    return get_state_dict(model)


def saves_model_in_mesh(config: ParallelismConfig, rank: int) -> bool:
    """Whether global ``rank`` is at coordinate 0 of the replicated and context-parallel dims of
    ``config``'s (row-major) device mesh: those dims hold copies, the sharded ones do not.
    """
    dims, sizes = config._get_mesh()
    stride = 1
    for dim, size in zip(reversed(dims), reversed(sizes)):
        if dim in ("dp_replicate", "cp") and (rank // stride) % size != 0:
            return False
        stride *= size
    return True


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def plan_shards(state_dict: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Group tensor names in order into shards of at most ``max_bytes`` (a bigger tensor alone)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = _nbytes(tensor)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _shard_name(weights_name: str, index: int, total: int) -> str:
    stem, suffix = weights_name.rsplit(".", 1)
    return f"{stem}-{index:05d}-of-{total:05d}.{suffix}"


def _remove_stale_shards(folder: Path, weights_name: str, keep: set[str]) -> None:
    stem, suffix = weights_name.rsplit(".", 1)
    pattern = re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.{re.escape(suffix)}$")
    for entry in folder.iterdir():
        if pattern.match(entry.name) and entry.name not in keep:
            entry.unlink()


def _write_shard(path: Path, tensors: dict[str, torch.Tensor], safe: bool) -> None:
    with atomic_write(path) as handle:
        if safe:
            write_safetensors(handle, tensors)
        else:
            torch.save(tensors, cast(BinaryIO, handle))  # torch.save needs only ``write``


def _tied_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The names to drop for safetensors: each repeat of one object (how sharded engines mark a
    tie), then each later name of one storage among plain tensors. DTensors and meta stand-ins
    are matched by identity only: their local memory says nothing about the full tensors.
    """
    module = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists
    dtensor = getattr(module, "DTensor", None)
    seen: set[int] = set()
    repeats: list[str] = []
    plain: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if id(value) in seen:
            repeats.append(name)
            continue
        seen.add(id(value))
        if dtensor is None or not isinstance(value, dtensor):
            plain[name] = value
    _, aliases = dedupe_shared_tensors(plain)
    return [name for name in tensors if name in aliases or name in repeats]


def save_model_weights(
    state_dict: dict[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
    *,
    gather: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    write: bool = True,
) -> list[str]:
    """Write ``state_dict`` as ``model.safetensors`` or shards plus an index; return file names.

    With ``gather`` (a collective every process calls with the same ``state_dict`` as held,
    e.g. DTensors), each shard's tensors are gathered just before that shard is written and
    dropped after; only processes with ``write`` write.

    Raises:
        ValueError: ``save_directory`` is an existing file, or ``max_shard_size`` is not a size.
    """
    folder = Path(save_directory)
    if folder.is_file():
        raise ValueError(
            f"save_directory {str(folder)!r} is a file; pass a folder to write the weights into."
        )
    max_bytes = convert_file_size_to_int(max_shard_size)
    if write:
        folder.mkdir(parents=True, exist_ok=True)
    tensors = dict(state_dict)
    if safe_serialization:
        removed = _tied_names(tensors)
        for name in removed:
            del tensors[name]
        if removed and write:
            logger.warning(
                "Removed shared tensor %s while saving. This should be OK, but check by "
                "verifying that you don't receive any warning while reloading",
                set(removed),
            )
    tensors = {k: v.detach() for k, v in tensors.items()}
    weights_name = SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME
    index_name = SAFE_WEIGHTS_INDEX_NAME if safe_serialization else WEIGHTS_INDEX_NAME
    shards = plan_shards(tensors, max_bytes)
    if len(shards) == 1:
        names = [weights_name]
    else:
        names = [_shard_name(weights_name, i + 1, len(shards)) for i in range(len(shards))]
    for name, keys in zip(names, shards):
        part = {k: tensors[k] for k in keys}
        if gather is not None:
            part = gather(part)
        if write:
            _write_shard(folder / name, part, safe_serialization)
        del part  # the next shard's full tensors replace these
    if not write:
        return [*names, index_name] if len(shards) > 1 else names
    _remove_stale_shards(folder, weights_name, set(names))
    index = folder / index_name
    if len(shards) == 1:
        index.unlink(missing_ok=True)
        return names
    weight_map = {k: name for name, keys in zip(names, shards) for k in keys}
    total = sum(_nbytes(t) for t in tensors.values())
    payload = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with atomic_write(index) as handle:
        handle.write(json.dumps(payload, indent=2, sort_keys=True).encode())
    return [*names, index_name]

"""Models and optimizers of a save_state checkpoint written sharded, through DCP, by every process.

When the strategy's ``checkpoint_layout`` is "sharded", each model's and optimizer's sharded
state dict (``strategy.model_state_dict(full=False)``: DTensor shards keyed by parameter name)
goes into its own DCP folder inside the checkpoint's staging folder -- Accelerate's names,
``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/`` -- with every process writing its
``__<rank>_*.distcp`` files in parallel. Each process then hashes the files it wrote, so they
join the manifest like every other file: the folder is still published atomically, a crash
leaves only the staging folder, and a missing or damaged part is refused on load.

Loading follows what is on disk, not the current strategy: DCP reshards while reading, so a
checkpoint saved by N processes loads on M (a single process loads it into a plain model).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hasten.checkpointing import checksum
from hasten.checkpointing.manifest import CorruptCheckpointError, FileRecord
from hasten.ops.collectives import gather_object
from hasten.state import PartialState

__all__ = [
    "load_sharded_model",
    "load_sharded_optimizer",
    "optimizer_owner",
    "save_sharded_parts",
    "sharded_model_dir",
    "sharded_optimizer_dir",
]

_MODEL_DIR = "pytorch_model_fsdp_{index}"
_OPTIMIZER_DIR = "optimizer_{index}"


def sharded_model_dir(index: int) -> str:
    """``pytorch_model_fsdp_<index>``: model ``index``'s DCP folder (Accelerate's name)."""
    return _MODEL_DIR.format(index=index)


def sharded_optimizer_dir(index: int) -> str:
    """``optimizer_<index>``: optimizer ``index``'s DCP folder (Accelerate's name)."""
    return _OPTIMIZER_DIR.format(index=index)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and PartialState().num_processes > 1


def _dcp(call: Any, state_dict: dict[str, Any], folder: Path) -> None:
    with warnings.catch_warnings():  # DCP warns that one process means no process group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        call(state_dict, checkpoint_id=folder, no_dist=not _distributed())


def optimizer_owner(optimizer: Any, models: Sequence[torch.nn.Module]) -> torch.nn.Module:
    """The prepared model whose parameters ``optimizer`` updates.

    Raises:
        ValueError: no prepared model holds its parameters.
    """
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in models:
        if any(id(p) in held for p in model.parameters()):
            return model
    raise ValueError(
        f"The optimizer {type(optimizer).__name__} updates none of the prepared models' "
        "parameters, so its sharded state cannot be keyed by parameter name. Prepare its model "
        "with it: accelerator.prepare(model, optimizer)."
    )


def _record(folder: Path, name: str) -> FileRecord:
    hasher = checksum.BlockHasher(checksum.BLOCK_BYTES)
    with open(folder / name, "rb") as handle:
        while chunk := handle.read(checksum.BLOCK_BYTES):
            hasher.update(chunk)
    return FileRecord(name, hasher.size, tuple(hasher.digests()))


def _my_files(staging: Path, part: str, rank: int) -> list[str]:
    names = [f"{part}/{p.name}" for p in (staging / part).glob(f"__{rank}_*.distcp")]
    if rank == 0:
        names.append(f"{part}/.metadata")
    return names


def save_sharded_parts(
    staging: Path, engine: Any, models: Sequence[Any], optimizers: Sequence[Any]
) -> list[FileRecord]:
    """Write every model's and optimizer's sharded state into ``staging``; every process calls.

    Returns:
        The records (size, block checksums) of the files this process wrote.
    """
    rank = PartialState().process_index
    parts = []
    for index, model in enumerate(models):
        part = sharded_model_dir(index)
        (staging / part).mkdir(exist_ok=True)
        _dcp(_save, engine.model_state_dict(model, full=False), staging / part)
        parts.append(part)
    for index, optimizer in enumerate(optimizers):
        part = sharded_optimizer_dir(index)
        (staging / part).mkdir(exist_ok=True)
        owner = optimizer_owner(optimizer, models)
        _dcp(_save, engine.optimizer_state_dict(owner, optimizer, full=False), staging / part)
        parts.append(part)
    names = [name for part in parts for name in _my_files(staging, part, rank)]
    with ThreadPoolExecutor(4, "hasten-hash") as pool:
        return list(pool.map(lambda name: _record(staging, name), names))


def _save(state_dict: dict[str, Any], **kwargs: Any) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state_dict, **kwargs)


def _load(state_dict: dict[str, Any], **kwargs: Any) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(state_dict, **kwargs)


def _verify(folder: Path, part: str, manifest: dict[str, Any] | None) -> None:
    """Check every file of ``part`` against the manifest (sizes were checked on opening)."""
    if manifest is None:
        return
    records = [r for name, r in manifest["files"].items() if name.startswith(part + "/")]
    if not any(r.name.endswith("/.metadata") for r in records):
        raise CorruptCheckpointError(
            f"{folder / part} is not a complete sharded checkpoint part: the manifest lists no "
            ".metadata for it. Load an earlier checkpoint."
        )
    block = int(manifest.get("block_bytes", checksum.BLOCK_BYTES))

    def check(record: FileRecord) -> None:
        hasher = checksum.BlockHasher(block)
        with open(folder / record.name, "rb") as handle:
            while chunk := handle.read(block):
                hasher.update(chunk)
        if tuple(hasher.digests()) != record.blocks:
            raise CorruptCheckpointError(
                f"{folder / record.name} is damaged (its checksums differ from the manifest). "
                "Load an earlier checkpoint."
            )

    # Each process verifies its share of the files, then all agree: every file is checked
    # once, whatever the number of processes, and a damaged one stops every process.
    state = PartialState()
    share = records[state.process_index :: state.num_processes] if _distributed() else records
    problem = ""
    try:
        with ThreadPoolExecutor(4, "hasten-verify") as pool:
            list(pool.map(check, share))
    except CorruptCheckpointError as exc:
        problem = str(exc)
    found = [m for m in gather_object([problem]) if m] if _distributed() else [problem]
    found = [m for m in found if m]
    if found:
        raise CorruptCheckpointError(found[0])


def _mismatch_error(what: str, folder: Path, exc: BaseException) -> ValueError:
    reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return ValueError(
        f"The checkpoint's {what} ({folder}) does not match the {what.split()[0]} given: "
        f"{reason}. "
        "Load a checkpoint saved from this model (same parameter names and shapes)."
    )


def load_sharded_model(
    folder: Path, index: int, engine: Any, model: Any, manifest: dict[str, Any] | None
) -> None:
    """Read model ``index``'s DCP folder into ``model`` (any number of processes)."""
    part = folder / sharded_model_dir(index)
    _verify(folder, sharded_model_dir(index), manifest)
    state = engine.model_state_dict(model, full=False)
    try:
        _dcp(_load, state, part)
    except BaseException as exc:  # DCP's CheckpointException (a BaseException) wraps every rank's
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise _mismatch_error(f"model {index}", part, exc) from exc
    engine.load_model_state_dict(model, state, full=False)


def load_sharded_optimizer(
    folder: Path,
    index: int,
    engine: Any,
    optimizer: Any,
    models: Sequence[Any],
    manifest: dict[str, Any] | None,
) -> None:
    """Read optimizer ``index``'s DCP folder into ``optimizer`` (any number of processes)."""
    part = folder / sharded_optimizer_dir(index)
    _verify(folder, sharded_optimizer_dir(index), manifest)
    owner = optimizer_owner(optimizer, models)
    state = engine.optimizer_state_dict(owner, optimizer, full=False)
    try:
        _dcp(_load, state, part)
    except BaseException as exc:  # DCP's CheckpointException (a BaseException) wraps every rank's
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise _mismatch_error(f"optimizer {index}", part, exc) from exc
    engine.load_optimizer_state_dict(owner, optimizer, state, full=False)

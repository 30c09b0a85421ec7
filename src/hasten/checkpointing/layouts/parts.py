"""The sharded parts of a save_state checkpoint: models and optimizers in DCP folders.

With the sharded layout (`hasten.checkpointing.layouts.sharded`), each model's and optimizer's
sharded state dict (``strategy.model_state_dict(full=False)``: DTensor shards keyed by parameter
name) goes into its own DCP folder inside the checkpoint's staging folder -- Accelerate's names,
``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/`` -- with every process writing its
```__<rank>_*.distcp`` files in parallel. One DCP call writes (and one reads) every part, through
`hasten.checkpointing.storage.dcp_storage`: files are hashed while written, so they join the manifest
like every other file without a second pass, and verified while read. The folder is still
published atomically, a crash leaves only the staging folder, and a missing or damaged part is
refused on load before any tensor is filled.

Loading follows what is on disk, not the current strategy: every layout reads the parts it
finds (`load_sharded_parts`), and DCP reshards while reading, so a checkpoint saved by N
processes loads on M (a single process loads it into a plain model).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hasten.checkpointing.layouts.base import on_cpu
from hasten.checkpointing.storage.io import UnsafeCheckpointError
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, FileRecord
from hasten.checkpointing.storage.paths import sharded_model_dir, sharded_optimizer_dir
from hasten.checkpointing.storage.writer import SavePlan, Snapshot, write_jobs
from hasten.optimizer import unwrap_optimizer
from hasten.state import PartialState
from hasten.strategies.checkpoints import ShardedStateDicts, StateDicts

__all__ = [
    "StagedParts",
    "load_sharded_parts",
    "make_part_folders",
    "optimizer_owner",
    "sharded_state_dicts",
    "stage_sharded",
    "write_sharded_parts",
]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and PartialState().num_processes > 1


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


def sharded_state_dicts(
    strategy: StateDicts,
    models: Sequence[Any],
    optimizers: Sequence[Any],
    paired: ShardedStateDicts | None = None,
) -> dict[str, dict[str, Any]]:
    """``{part folder: sharded state dict}`` of every model and optimizer (DTensor shards).

    ``paired``: the strategy, when it gives a model's and its one optimizer's shards in one pass.
    """
    state, _, _ = _get_states(
        strategy, paired, dict(enumerate(models)), dict(enumerate(optimizers)), models
    )
    return state


def _get_states(
    strategy: StateDicts,
    paired: ShardedStateDicts | None,
    models: dict[int, Any],
    optimizers: dict[int, Any],
    prepared: Sequence[Any],
) -> tuple[dict[str, dict[str, Any]], dict[int, Any], dict[int, int]]:
    """The parts' sharded state dicts, each optimizer's owner, and the model/optimizer pairs.

    With ``paired`` (a strategy that has it), a model with exactly one optimizer gets both
    state dicts from one call: torch's state-dict API then walks the model once.
    """
    owners = {index: optimizer_owner(opt, prepared) for index, opt in optimizers.items()}
    pairs: dict[int, int] = {}
    if paired is not None:
        for index, model in models.items():
            mine = [o for o, owner in owners.items() if owner is model]
            if len(mine) == 1:
                pairs[index] = mine[0]
    state: dict[str, dict[str, Any]] = {}
    for index, model in models.items():
        if paired is not None and index in pairs:
            both = paired.sharded_state_dicts(model, optimizers[pairs[index]])
            state[sharded_model_dir(index)], state[sharded_optimizer_dir(pairs[index])] = both
        else:
            state[sharded_model_dir(index)] = strategy.model_state_dict(model, full=False)
    for index, optimizer in optimizers.items():
        if index not in pairs.values():
            state[sharded_optimizer_dir(index)] = strategy.optimizer_state_dict(
                owners[index], optimizer, full=False
            )
    return state, owners, pairs


def _set_states(
    strategy: StateDicts,
    paired: ShardedStateDicts | None,
    state: dict[str, dict[str, Any]],
    models: dict[int, Any],
    optimizers: dict[int, Any],
    owners: dict[int, Any],
    pairs: dict[int, int],
) -> None:
    """Load what `_get_states` gave (and DCP filled) into the models and optimizers."""
    for index, model in models.items():
        part = state[sharded_model_dir(index)]
        if paired is not None and index in pairs:
            mate = pairs[index]
            paired.load_sharded_state_dicts(
                model, optimizers[mate], part, state[sharded_optimizer_dir(mate)]
            )
        else:
            strategy.load_model_state_dict(model, part, full=False)
    for index, optimizer in optimizers.items():
        if index not in pairs.values():
            loaded = state[sharded_optimizer_dir(index)]
            strategy.load_optimizer_state_dict(owners[index], optimizer, loaded, full=False)


@dataclass
class StagedParts:
    """The sharded parts of one save: copied now, or (optimizer states) on the writer thread."""

    names: list[str]
    copies: dict[str, Any]
    deferred: dict[str, Any]  # part -> its param_groups, copied now; the state comes later

    def write(self, plan: SavePlan, snapshot: Snapshot | None, group: Any) -> None:
        """Write every part through DCP (the other files meanwhile), adopting the records."""
        if snapshot is not None:
            snapshot.take()
        parts = dict(self.copies)
        for name, groups in self.deferred.items():
            assert snapshot is not None
            parts[name] = {**snapshot.copied(name), "param_groups": groups}
        # the other files (RNG, schedulers, loaders) are written while DCP writes the shards
        mine, everyone = write_sharded_parts(
            plan.staging, parts, group=group, also=lambda: write_jobs(plan)
        )
        plan.prewritten = everyone if plan.rank == 0 else mine
        plan.collected = True


def stage_sharded(
    strategy: ShardedStateDicts,
    prepared: Sequence[Any],
    optimizers: Sequence[Any],
    copy: Callable[[Any], Any],
    deferred: Snapshot | None,
) -> StagedParts:
    """Every model's and optimizer's sharded state dict, staged for a (background) DCP write.

    ``copy`` copies to host memory (identity for a synchronous save); with ``deferred`` (an
    asynchronous save) model shards are copied to host memory now; optimizer states on
    the CPU are copied on the writer thread (their next ``step()`` waits for it), except their
    ``param_groups``, which a scheduler may change before that step.
    """
    parts = sharded_state_dicts(strategy, prepared, optimizers, paired=strategy)
    staged = StagedParts(list(parts), {}, {})
    for index, optimizer in enumerate(optimizers):
        name = sharded_optimizer_dir(index)
        state = parts[name]
        if deferred is not None and on_cpu(state) and set(state) == {"state", "param_groups"}:
            deferred.defer(
                name,
                {"state": parts.pop(name)["state"]},
                unwrap_optimizer(optimizer),
            )
            staged.deferred[name] = copy(state["param_groups"])
    staged.copies = {name: copy(state) for name, state in parts.items()}
    return staged


def make_part_folders(staging: Path, parts: Sequence[str]) -> None:
    """Create the part folders in a fresh staging folder (the main process, before DCP runs)."""
    for part in parts:
        (staging / part).mkdir(exist_ok=True)


def write_sharded_parts(
    staging: Path,
    parts: dict[str, dict[str, Any]],
    *,
    group: Any = None,
    also: Callable[[], list[FileRecord]] | None = None,
) -> tuple[list[FileRecord], list[FileRecord]]:
    """Write every part with one DCP save; every process calls it, after `make_part_folders`.

    ``group`` is the process group DCP coordinates over (None: the default one; a background
    save passes its own, so its collectives never interleave with the training loop's).
    ``also`` writes this process's other files meanwhile and returns their records.

    Returns:
        The records (size, block checksums) of the files this process wrote, and on the main
        process those of every process's files (empty elsewhere).
    """
    from hasten.checkpointing.storage.dcp_storage import PartedWriter

    writer = PartedWriter(staging, list(parts), also=also)
    try:
        with warnings.catch_warnings():  # DCP warns that one process means no process group
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            _save(parts, storage_writer=writer, process_group=group, no_dist=not _distributed())
    except BaseException as exc:  # DCP's CheckpointException (a BaseException) wraps every rank's
        failures = [f[0] for f in getattr(exc, "failures", {}).values()]
        if not failures or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        first = failures[0]
        if isinstance(first, Exception):
            raise first from exc  # e.g. the OSError of a full disk, on every process
        raise RuntimeError(f"The sharded save failed: {first!r}") from exc
    return _written(writer)


def _written(writer: Any) -> tuple[list[FileRecord], list[FileRecord]]:
    """What ``writer`` wrote, once DCP has finished (every part and ``.metadata`` on disk)."""
    return list(writer.records), list(writer.all_records)


def _save(state_dict: dict[str, Any], **kwargs: Any) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state_dict, **kwargs)


def _load(state_dict: dict[str, Any], **kwargs: Any) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(state_dict, **kwargs)


def _part_label(part: str) -> str:
    """``"model 0"`` / ``"optimizer 1"`` for a part folder name."""
    kind = "optimizer" if part.startswith("optimizer_") else "model"
    return f"{kind} {part.rsplit('_', 1)[-1]}"


def _mismatch(folder: Path, part: str, reason: str) -> ValueError:
    what = _part_label(part)
    return ValueError(
        f"The checkpoint's {what} ({folder / part}) does not match the {what.split()[0]} given: "
        f"{reason.rstrip('.')}. Load a checkpoint saved from this model (same parameter names "
        "and shapes)."
    )


def _check_model(folder: Path, part: str, state: dict[str, Any], saved: dict[str, Any]) -> None:
    """Refuse a checkpoint of another model, naming its first differing tensor (before DCP)."""
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        item = saved.get(f"{part}.{key}")
        if item is None:
            raise _mismatch(folder, part, f"{key} is not in the checkpoint")
        size = getattr(item, "size", None)
        if size is not None and tuple(size) != tuple(value.shape):
            raise _mismatch(
                folder, part, f"{key} is {tuple(size)} in the checkpoint, {tuple(value.shape)} here"
            )


def _load_error(exc: BaseException, folder: Path, parts: list[str]) -> BaseException:
    """The error to raise for a failed DCP load: a damaged file, or a mismatch naming its part."""
    failures = [f[0] for f in getattr(exc, "failures", {}).values()] or [exc]
    for failure in failures:
        if isinstance(failure, CorruptCheckpointError):
            return CorruptCheckpointError(str(failure))
        if isinstance(failure, UnsafeCheckpointError):
            return UnsafeCheckpointError(str(failure))
    text = str(failures[0]).strip()
    reason = text.splitlines()[-1] if text else type(failures[0]).__name__
    part = next((p for p in parts if f"{p}." in text), parts[0])
    return _mismatch(folder, part, reason)


def load_sharded_parts(
    folder: Path,
    strategy: StateDicts,
    paired: ShardedStateDicts | None,
    models: dict[int, Any],
    optimizers: dict[int, Any],
    prepared: Sequence[Any],
    manifest: dict[str, Any] | None,
) -> None:
    """Read the DCP folders of ``models`` and ``optimizers`` (by index) in one DCP load.

    Works on any number of processes; with a manifest every file read is verified first.
    ``paired``: the strategy, when it reads a model and its one optimizer in one pass.

    Raises:
        CorruptCheckpointError: a part's file is damaged or its ``.metadata`` is not listed.
        ValueError: the checkpoint holds another model (names the part and the first mismatch).
        UnsafeCheckpointError: an index or entry holds objects that could run code (see `dcp_safe`).
    """
    from hasten.checkpointing.storage.dcp_safe import SafeLoadPlanner
    from hasten.checkpointing.storage.dcp_storage import PartedReader

    state, owners, pairs = _get_states(strategy, paired, models, optimizers, prepared)
    parts = list(state)
    distributed = _distributed()
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    reader = PartedReader(folder, parts, manifest, rank=rank, world_size=world_size)
    try:
        for index in models:  # every process checks the same shapes: all refuse together
            part = sharded_model_dir(index)
            _check_model(folder, part, state[part], reader.metadata.state_dict_metadata)
        try:
            with warnings.catch_warnings():  # DCP warns that one process means no group
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                _load(
                    state,
                    storage_reader=reader,
                    planner=SafeLoadPlanner(),
                    no_dist=not distributed,
                )
        except BaseException as exc:  # DCP's CheckpointException wraps every rank's error
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise _load_error(exc, folder, parts) from exc
    finally:
        reader.close()
    _set_states(strategy, paired, state, models, optimizers, owners, pairs)

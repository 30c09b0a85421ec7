"""The sharded parts of a save_state checkpoint: models and optimizers in DCP folders.

With the sharded layout (`hasten.checkpointing.layouts.dcp_shards`), each model's and optimizer's
sharded state dict (``strategy.model_state_dict(full=False)``: DTensor shards keyed by parameter
name) goes into its own DCP folder inside the checkpoint's staging folder -- Accelerate's names,
``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/`` -- with every process writing its
``__<rank>_*.distcp`` files in parallel. One DCP call writes (and one reads) every part, through
`hasten.checkpointing.storage.dcp` (the one module that calls DCP): files are hashed while
written, so they join the manifest like every other file without a second pass, and verified
while read. The folder is still
published atomically, a crash leaves only the staging folder, and a missing or damaged part is
refused on load before any tensor is filled.

Loading follows what is on disk, not the current strategy: every layout reads the parts it
finds (`load_sharded_parts`), and DCP reshards while reading, so a checkpoint saved by N
processes loads on M (a single process loads it into a plain model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hasten.checkpointing.layouts.base import on_cpu
from hasten.checkpointing.storage.paths import sharded_model_dir, sharded_optimizer_dir
from hasten.checkpointing.storage.writer import LayoutWritten, SavePlan, Snapshot, write_jobs
from hasten.optimizer import unwrap_optimizer
from hasten.strategies.checkpoints import ShardedStateDicts, StateDicts

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = [
    "StagedParts",
    "load_sharded_parts",
    "make_part_folders",
    "optimizer_owner",
    "sharded_state_dicts",
    "stage_sharded",
]


def optimizer_owner(
    optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]
) -> torch.nn.Module:
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

    def write(
        self, plan: SavePlan, snapshot: Snapshot | None, group: ProcessGroup | None
    ) -> LayoutWritten:
        """Write every part through DCP (the plan's other files meanwhile); return the records."""
        if snapshot is not None:
            snapshot.take()
        parts = dict(self.copies)
        for name, groups in self.deferred.items():
            assert snapshot is not None
            parts[name] = {**snapshot.copied(name), "param_groups": groups}
        from hasten.checkpointing.storage.dcp import write_parts

        # the other files (RNG, schedulers, loaders) are written while DCP writes the shards
        mine, everyone = write_parts(
            plan.staging, parts, group=group, also=lambda: write_jobs(plan)
        )
        records = everyone if plan.rank == 0 else mine
        return LayoutWritten(records=records, collected=True, jobs_written=True)


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
    """The error to raise for DCP's failure to fill the parts: a mismatch naming its part."""
    failures = [f[0] for f in getattr(exc, "failures", {}).values()] or [exc]
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
    from hasten.checkpointing.storage.dcp import read_parts

    state, owners, pairs = _get_states(strategy, paired, models, optimizers, prepared)
    parts = list(state)

    def check(
        metadata: Metadata,
    ) -> None:  # every process checks the same shapes: all refuse together
        for index in models:
            part = sharded_model_dir(index)
            _check_model(folder, part, state[part], metadata.state_dict_metadata)

    read_parts(
        folder,
        state,
        manifest,
        check=check,
        explain=lambda exc: _load_error(exc, folder, parts),
    )
    _set_states(strategy, paired, state, models, optimizers, owners, pairs)

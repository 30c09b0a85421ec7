"""The disk decides the load: how each model and optimizer of a checkpoint is read back.

`formats_on_disk` looks at the folder once: a model saved sharded is a DCP part folder
(``pytorch_model_fsdp_<i>/``), a whole one ``model.safetensors`` or ``pytorch_model.bin``, and
one an engine saved its engine's tag folder (``pytorch_model/``). `read_from_disk` then starts
every read, whatever layout the run has now: DCP parts in one DCP load (resharded to this
run's processes), whole files through the layout's `ModelRestore` / `OptimizerRestore` (into
the live tensors, or through the sharding strategy). So no save layout's ``load`` knows
another layout's format, and a checkpoint loads on any number of processes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from hasten.checkpointing.layouts.base import CheckpointContents, LayoutLoad, warn_or_raise
from hasten.checkpointing.layouts.dcp_parts import load_sharded_parts
from hasten.checkpointing.layouts.model_files import load_gradients
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.manifest import CorruptCheckpointError
from hasten.checkpointing.storage.reader import CheckpointReader, PendingRead
from hasten.core.errors import CheckpointNotFoundError
from hasten.state import PartialState
from hasten.strategies.checkpoints import ShardedStateDicts, StateDicts

if TYPE_CHECKING:
    import torch

__all__ = [
    "Format",
    "ModelRestore",
    "OnDisk",
    "OptimizerRestore",
    "Restore",
    "check_counts",
    "formats_on_disk",
    "read_from_disk",
]


class Format(enum.Enum):
    """How one model or optimizer is stored in a checkpoint folder."""

    DCP = "dcp"  #: a DCP part folder: each process's shards
    SAFETENSORS = "safetensors"  #: one whole model as safetensors
    PICKLE = "pickle"  #: one whole model or optimizer as a torch pickle
    ENGINE = "engine"  #: an engine's own folder (DeepSpeed's tag folder)


@dataclass(frozen=True)
class OnDisk:
    """What `formats_on_disk` found: one `Format` per model and per optimizer, in order."""

    folder: Path
    models: tuple[Format, ...]
    optimizers: tuple[Format, ...]


def _model_format(folder: Path, index: int) -> Format:
    if (folder / paths.sharded_model_dir(index)).is_dir():
        return Format.DCP
    if (folder / paths.model_file(index, True)).is_file():
        return Format.SAFETENSORS
    if (folder / paths.model_file(index, False)).is_file():
        return Format.PICKLE
    tag = paths.model_file(index, False).removesuffix(".bin")  # the engine's tag folder
    if (folder / tag).is_dir():
        return Format.ENGINE
    raise CheckpointNotFoundError(
        f"The checkpoint at {folder} holds no readable model {index}: none of "
        f"{paths.model_file(index, True)}, {paths.model_file(index, False)} (whole weights), "
        f"{paths.sharded_model_dir(index)}/ (DCP shards) or {tag}/ (an engine's folder). Pass "
        "the folder save_state wrote for the same models."
    )


def formats_on_disk(folder: Path, num_models: int, num_optimizers: int) -> OnDisk:
    """How each of ``num_models`` models and ``num_optimizers`` optimizers is stored.

    Raises:
        CheckpointNotFoundError: a model has no file or folder in any format (names them).
    """
    models = tuple(_model_format(folder, i) for i in range(num_models))
    optimizers = tuple(
        Format.DCP if (folder / paths.sharded_optimizer_dir(i)).is_dir() else Format.PICKLE
        for i in range(num_optimizers)
    )
    return OnDisk(folder, models, optimizers)


class ModelRestore(Protocol):
    """How a layout puts a whole model file back (`model_files.InPlaceModels`, ...)."""

    #: Whether the checkpoint's per-process gradient files are restored too.
    gradients: bool

    def start(
        self, files: CheckpointReader, index: int, model: nn.Module, name: str, strict: bool
    ) -> PendingRead: ...

    def apply(
        self,
        index: int,
        model: nn.Module,
        prepared: nn.Module,
        state: dict[str, torch.Tensor],
        strict: bool,
    ) -> None: ...


class OptimizerRestore(Protocol):
    """How a layout puts a whole optimizer file back (`optimizer_files.InPlaceOptimizers`, ...)."""

    def start(
        self,
        files: CheckpointReader,
        index: int,
        optimizer: torch.optim.Optimizer,
        where: str | torch.device,
    ) -> PendingRead: ...

    def apply(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any], prepared: Sequence[nn.Module]
    ) -> None: ...


@dataclass(frozen=True)
class Restore:
    """How one layout puts what is read in place: whole files through ``models`` and
    ``optimizers``; DCP parts through ``strategy`` (``paired``: the strategy, when it reads a
    model's and its one optimizer's shards in one pass)."""

    models: ModelRestore
    optimizers: OptimizerRestore
    strategy: StateDicts
    paired: ShardedStateDicts | None = None


def _start_optimizer(
    restore: Restore,
    files: CheckpointReader,
    index: int,
    optimizer: torch.optim.Optimizer,
    where: str | torch.device,
) -> PendingRead | Exception:
    """Start reading optimizer ``index``; a failure is returned, to be raised in its turn."""
    try:
        return restore.optimizers.start(files, index, optimizer, where)
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported in order by finish()
        return exc


def read_from_disk(load: LayoutLoad, restore: Restore) -> Callable[[], None]:
    """Start reading every model and optimizer as the disk says; return the step that applies
    them (the DCP parts are read in it, in one DCP load).

    Raises:
        ValueError: another number of models, optimizers, schedulers or custom objects, or a
            folder an engine wrote, loaded without that engine.
        CheckpointNotFoundError: a model has no file in any format.
    """
    files, contents = load.files, load.contents
    check_counts(files.folder, contents)
    disk = formats_on_disk(files.folder, len(contents.models), len(contents.optimizers))
    if Format.ENGINE in disk.models:
        raise ValueError(
            f"The checkpoint at {files.folder} was written by an engine (DeepSpeed's "
            "save_checkpoint), which this run does not use. Load it with the same DeepSpeed "
            "configuration it was saved with."
        )
    prepared = contents.modules
    dcp_models = [i for i, f in enumerate(disk.models) if f is Format.DCP]
    dcp_optimizers = [i for i, f in enumerate(disk.optimizers) if f is Format.DCP]
    # Every file is parsed and queued first, so parsing one overlaps reading the others;
    # each is applied only once all its blocks are read and verified.
    models = [
        None
        if fmt is Format.DCP
        else restore.models.start(
            files,
            i,
            contents.models[i],
            paths.model_file(i, fmt is Format.SAFETENSORS),
            load.strict,
        )
        for i, fmt in enumerate(disk.models)
    ]
    optimizers = [
        (i, o, _start_optimizer(restore, files, i, o, load.map_location))
        for i, o in enumerate(contents.optimizers)
        if i not in dcp_optimizers
    ]

    def finish() -> None:
        if dcp_models or dcp_optimizers:  # one DCP load for every sharded part
            load_sharded_parts(
                files.folder,
                restore.strategy,
                restore.paired,
                {i: prepared[i] for i in dcp_models},
                {i: contents.optimizers[i] for i in dcp_optimizers},
                prepared,
                files.manifest,
            )
        for index, pending in enumerate(models):
            if pending is not None:
                model = contents.models[index]
                restore.models.apply(index, model, prepared[index], pending.result(), load.strict)
        if restore.models.gradients:
            load_gradients(files, contents.models, PartialState().process_index)
        for index, optimizer, started in optimizers:
            try:
                if isinstance(started, BaseException):
                    raise started
                restore.optimizers.apply(optimizer, started.result(), prepared)
            except CorruptCheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001 - named and re-raised, or warned
                warn_or_raise(f"optimizer {index}", exc, load.strict, stacklevel=5)

    return finish


def check_counts(folder: Path, contents: CheckpointContents) -> None:
    """Refuse a checkpoint of another number of models, optimizers, schedulers or custom objects.

    Raises:
        ValueError: names the part, both counts and the fix.
    """
    found = {
        "models": len(
            [p for p in folder.iterdir() if p.name.startswith(("model", "pytorch_model"))]
        ),
        "custom objects": len(list(folder.glob("custom_checkpoint_*.pkl"))),
        "optimizers": len(
            [p for p in folder.glob("optimizer*") if p.suffix == ".bin" or p.is_dir()]
        ),
        "schedulers": len(list(folder.glob("scheduler*.bin"))),
    }
    given = {
        "models": len(contents.models),
        "custom objects": len(contents.custom_objects),
        "optimizers": len(contents.optimizers),
        "schedulers": len(contents.schedulers),
    }
    for part, count in found.items():
        if count != given[part]:
            raise ValueError(
                f"The checkpoint at {folder} holds {count} {part} but {given[part]} were "
                f"prepared or registered. Prepare/register the same {part} (in the same order) "
                "as when it was saved."
            )

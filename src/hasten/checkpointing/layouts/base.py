"""The seam between what a checkpoint holds and how its models and optimizers are written.

A `CheckpointLayout` is one way of saving models and optimizers; a strategy declares which
(`hasten.strategies.base.Strategy.checkpoint_layout`). `save_contents` / `load_contents`
(`hasten.checkpointing.state`) handle what every checkpoint has -- schedulers, data loaders,
custom objects, the scaler, RNG states, the save transaction and the agreement between
processes -- and hand the models and optimizers to the layout:

- `CheckpointLayout.contents` turns the Accelerator's prepared objects (`PreparedObjects`)
  into the `CheckpointContents` of one call (for a save, the state dicts the user's pre-hooks
  see);
- `CheckpointLayout.plan` adds this process's model and optimizer files to the save's plan and
  returns what its `write` needs (typed per layout: ``StagedT``), `CheckpointLayout.write` runs
  the collective part (DCP, or the engine's own save);
- `CheckpointLayout.load` starts reading them back and returns the step that applies them.

Each layout derives from `CheckpointLayout` alone; they share code through collaborators
(`model_files`, `optimizer_files`, `dcp_parts`), and what is on disk decides how a load reads
(`hasten.checkpointing.layouts.read`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from hasten.checkpointing.storage.reader import CheckpointReader
from hasten.checkpointing.storage.writer import HostBuffers, LayoutWritten, SavePlan, Snapshot
from hasten.core.nested import recursively_apply

__all__ = [
    "CheckpointContents",
    "CheckpointLayout",
    "LayoutLoad",
    "LayoutSave",
    "PreparedObjects",
    "Stateful",
    "on_cpu",
    "unwrapped_contents",
    "warn_or_raise",
]

#: What a layout's `CheckpointLayout.plan` hands to its `CheckpointLayout.write` (typed, not Any).
StagedT = TypeVar("StagedT")


class Stateful(Protocol):
    """An object whose state a checkpoint saves and restores (optimizer, scheduler, scaler)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class PreparedObjects:
    """What the Accelerator prepared or registered, as one save_state or load_state takes it.

    ``models`` are as prepare returned them; ``mid_cycle``: the call happens inside a gradient
    accumulation cycle.
    """

    models: Sequence[nn.Module] = ()
    optimizers: Sequence[torch.optim.Optimizer] = ()
    schedulers: Sequence[Stateful] = ()
    dataloaders: Sequence[object] = ()
    custom_objects: Sequence[Stateful] = ()
    scaler: Stateful | None = None
    mid_cycle: bool = False


@dataclass(frozen=True)
class CheckpointContents:
    """What one save_state or load_state holds, in the order the Accelerator prepared or
    registered it.

    ``model_states`` (saving) are the models' state dicts as the layout gives them: the user's
    save pre-hooks see this list and may edit it. ``models`` are the user's modules, unwrapped:
    what load pre-hooks see and what a replicated checkpoint is read into. ``prepared_models``
    are the modules prepare returned, which the strategy's state-dict methods take (empty:
    ``models``). ``optimizer_states`` are full optimizer states a layout took before the
    pre-hooks (gathered across processes), or None to take each optimizer's own. Which layout
    writes and reads them is passed beside the contents (`save_contents(layout=...)`), never
    held here.
    """

    model_states: list[dict[str, torch.Tensor]] = field(default_factory=list)
    models: list[nn.Module] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom_objects: list[Any] = field(default_factory=list)
    scaler: Any | None = None
    prepared_models: list[nn.Module] = field(default_factory=list)
    optimizer_states: list[dict[str, Any]] | None = None

    @property
    def modules(self) -> list[nn.Module]:
        """The modules the strategy's state-dict methods take: as prepared, else the models."""
        return self.prepared_models or self.models


@dataclass(frozen=True)
class LayoutSave:
    """One save as a layout sees it: this process's plan of files and the host copies.

    ``buffers`` is an asynchronous save's host memory (None: synchronous, nothing copied);
    ``deferred`` takes optimizer states on the writer thread (see `Snapshot`).
    """

    plan: SavePlan
    contents: CheckpointContents
    safe_serialization: bool = True
    buffers: HostBuffers | None = None
    deferred: Snapshot | None = None

    def copy(self, obj: Any) -> Any:
        """``obj`` with its tensors copied to host memory for an asynchronous save (else as is)."""
        return self.buffers.copy(obj) if self.buffers is not None else obj


@dataclass(frozen=True)
class LayoutLoad:
    """One load as a layout sees it: the checkpoint's files and what to restore from them."""

    files: CheckpointReader
    contents: CheckpointContents
    map_location: str | torch.device = "cpu"
    strict: bool = True


class CheckpointLayout(Generic[StagedT]):
    """One way of writing and reading a checkpoint's models and optimizers (see the module)."""

    #: What the layout needs one folder every process writes for, named in the refusal
    #: ("A sharded checkpoint"); None: each process may write into a folder of its own.
    needs_one_folder: str | None = None

    def contents(self, prepared: PreparedObjects, *, for_save: bool) -> CheckpointContents:
        """What one save_state (``for_save``) or load_state holds, from the prepared objects."""
        raise NotImplementedError

    def plan(self, save: LayoutSave) -> StagedT:
        """Add this process's model and optimizer files to ``save.plan``; return what `write`
        needs."""
        raise NotImplementedError

    def write(
        self, save: LayoutSave, staged: StagedT
    ) -> LayoutWritten | Callable[[], LayoutWritten]:
        """Write what every process writes together (DCP, an engine's own save).

        Returns what it wrote (`LayoutWritten`: nothing by default), or for an asynchronous
        save what the writer thread runs, before writing the plan's files, to write it.
        """
        return LayoutWritten()

    def load(self, load: LayoutLoad) -> Callable[[], None]:
        """Start reading the models and optimizers; return the step that puts them in place.

        The common parts are started between the two, so their files are parsed while these
        are read.
        """
        raise NotImplementedError


def on_cpu(obj: object) -> bool:
    """Whether every tensor in ``obj`` is on the CPU."""
    found: list[bool] = []
    recursively_apply(lambda t: found.append(t.device.type == "cpu"), obj)
    return all(found)


def warn_or_raise(part: str, exc: BaseException, strict: bool, stacklevel: int = 4) -> None:
    """Raise (``strict``) or warn that ``part`` could not be restored from the checkpoint."""
    message = f"Could not restore {part} from the checkpoint: {exc}"
    if strict:
        raise RuntimeError(
            message + " (pass strict=False to skip this part with a warning)"
        ) from exc
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def unwrapped_contents(
    unwrap: Callable[[nn.Module], nn.Module],
    prepared: PreparedObjects,
    model_states: list[dict[str, torch.Tensor]] | None = None,
    optimizer_states: list[dict[str, Any]] | None = None,
) -> CheckpointContents:
    """The contents of a layout that saves models: the user's modules (``unwrap``-ped) beside
    the prepared ones, and (for a save) the states the layout took."""
    return CheckpointContents(
        model_states=model_states if model_states is not None else [],
        models=[unwrap(m) for m in prepared.models],
        prepared_models=list(prepared.models),
        optimizers=list(prepared.optimizers),
        schedulers=list(prepared.schedulers),
        dataloaders=list(prepared.dataloaders),
        custom_objects=list(prepared.custom_objects),
        scaler=prepared.scaler,
        optimizer_states=optimizer_states,
    )

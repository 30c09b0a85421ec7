"""The seam between what a checkpoint holds and how its models and optimizers are written.

A `CheckpointLayout` is one way of saving models and optimizers; a strategy declares which
(`hasten.strategies.base.Strategy.checkpoint_layout`). `save_contents` / `load_contents`
(`hasten.checkpointing.state`) handle what every checkpoint has -- schedulers, data loaders,
custom objects, the scaler, RNG states, the staging folder, the manifest and the agreement
between processes -- and hand the models and optimizers to the layout:

- `CheckpointLayout.contents` turns the Accelerator's prepared objects into the
  `CheckpointContents` of one call (for a save, the state dicts the user's pre-hooks see);
- `CheckpointLayout.plan` adds this process's model and optimizer files to the save's plan,
  `CheckpointLayout.write` runs the collective part (DCP, or the engine's own save);
- `CheckpointLayout.load` starts reading them back and returns the step that applies them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hasten.checkpointing.storage.reader import CheckpointReader
from hasten.checkpointing.storage.writer import HostBuffers, SavePlan, Snapshot
from hasten.core.nested import recursively_apply

__all__ = [
    "CheckpointContents",
    "CheckpointLayout",
    "LayoutLoad",
    "LayoutSave",
    "on_cpu",
    "warn_or_raise",
]


@dataclass
class CheckpointContents:
    """What one save_state or load_state holds, in the order the Accelerator prepared or
    registered it, and the layout that writes and reads its models and optimizers.

    ``model_states`` (saving) are the models' state dicts as the layout gives them: the user's
    save pre-hooks see them and may edit them. ``models`` are the user's modules, unwrapped:
    what load pre-hooks see and what a replicated checkpoint is read into. ``prepared_models``
    are the modules prepare returned, which the strategy's state-dict methods take (empty:
    ``models``). ``optimizer_states`` are full optimizer states a layout took before the
    pre-hooks (gathered across processes), or None to take each optimizer's own.
    ``layout`` None is the replicated layout over the base strategy (Accelerate's positional
    ``save_accelerator_state`` / ``load_accelerator_state``).
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
    layout: CheckpointLayout | None = None


@dataclass
class LayoutSave:
    """One save as a layout sees it: this process's plan of files and the host copies.

    ``buffers`` is an asynchronous save's host memory (None: synchronous, nothing copied);
    ``deferred`` takes optimizer states on the writer thread (see `Snapshot`); ``staged`` is
    what the layout's `CheckpointLayout.plan` prepared for its `CheckpointLayout.write`.
    """

    plan: SavePlan
    contents: CheckpointContents
    safe_serialization: bool = True
    buffers: HostBuffers | None = None
    deferred: Snapshot | None = None
    staged: Any = None

    def copy(self, obj: Any) -> Any:
        """``obj`` with its tensors copied to host memory for an asynchronous save (else as is)."""
        return self.buffers.copy(obj) if self.buffers is not None else obj


@dataclass
class LayoutLoad:
    """One load as a layout sees it: the checkpoint's files and what to restore from them."""

    files: CheckpointReader
    contents: CheckpointContents
    map_location: Any = "cpu"
    strict: bool = True


class CheckpointLayout:
    """One way of writing and reading a checkpoint's models and optimizers (see the module)."""

    #: What the layout needs one folder every process writes for, named in the refusal
    #: ("A sharded checkpoint"); None: each process may write into a folder of its own.
    needs_one_folder: str | None = None

    def contents(
        self,
        *,
        models: Sequence[nn.Module],
        optimizers: Sequence[Any],
        schedulers: Sequence[Any],
        dataloaders: Sequence[Any],
        custom_objects: Sequence[Any],
        scaler: Any | None,
        for_save: bool,
        mid_cycle: bool = False,
    ) -> CheckpointContents:
        """What one save_state (``for_save``) or load_state holds, from the prepared objects.

        ``models`` are as prepare returned them; ``mid_cycle``: the save happens inside a
        gradient accumulation cycle.
        """
        raise NotImplementedError

    def plan(self, save: LayoutSave) -> None:
        """Add this process's model and optimizer files to ``save.plan`` (nothing by default)."""

    def write(self, save: LayoutSave) -> Callable[[], None] | None:
        """Write what every process writes together (DCP, an engine's own save).

        Returns what an asynchronous save's writer thread runs before writing the plan's files
        (None: nothing beyond the plan).
        """
        return None

    def load(self, load: LayoutLoad) -> Callable[[], None]:
        """Start reading the models and optimizers; return the step that puts them in place.

        The common parts are started between the two, so their files are parsed while these
        are read.
        """
        raise NotImplementedError


def on_cpu(obj: Any) -> bool:
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

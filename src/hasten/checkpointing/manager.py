"""The Accelerator's checkpoint bookkeeping: where to save, hooks, pending async saves.

The Accelerator facade hands in its prepared objects on each call; this class decides the
folder (explicit or ``checkpoint_<i>`` naming), runs the user's pre-hooks, and delegates the
writing and reading to `hasten.checkpointing.state`.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from hasten.checkpointing.layouts.base import CheckpointLayout
from hasten.checkpointing.preemption import PreemptionWatcher
from hasten.checkpointing.state import (
    CheckpointContents,
    finish_async_save,
    load_contents,
    save_contents,
)
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.writer import HostBuffers, PendingSave
from hasten.config.project import ProjectConfiguration
from hasten.core.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    NotCheckpointableError,
)

__all__ = ["CheckpointManager", "check_checkpointable"]

SaveHook = Callable[[list[torch.nn.Module], list[dict[str, Any]], str], None]
LoadHook = Callable[[list[torch.nn.Module], str], None]


def check_checkpointable(objects: Sequence[Any]) -> None:
    """Refuse objects that cannot be saved and restored.

    Raises:
        NotCheckpointableError: (a ValueError, as in Accelerate, and a TypeError) an object
            lacks ``state_dict`` or ``load_state_dict`` (all are named).
    """
    bad = [
        f"\n\t- Item at index {i}, `{type(obj).__name__}`"
        for i, obj in enumerate(objects)
        if not (callable(getattr(obj, "state_dict", None)))
        or not callable(getattr(obj, "load_state_dict", None))
    ]
    if bad:
        # Accelerate's sentence and list first (its tests look for "Item at index 0")
        raise NotCheckpointableError(
            "All `objects` must include a `state_dict` and `load_state_dict` function to be "
            f"stored. The following inputs are invalid:{''.join(bad)}\n(hasten: wrap each in a "
            "small class that provides both methods.)"
        )


class CheckpointManager:
    """Checkpoint folders, pre-hooks and asynchronous saves for one Accelerator."""

    def __init__(self, project_config: ProjectConfiguration) -> None:
        self.project_config = project_config
        self._save_hooks: OrderedDict[int, SaveHook] = OrderedDict()
        self._load_hooks: OrderedDict[int, LoadHook] = OrderedDict()
        self._pending: PendingSave | None = None
        self._watcher: PreemptionWatcher | None = None
        self._host_buffers = HostBuffers()  # reused by every async save of this Accelerator

    def register_save_state_pre_hook(self, hook: SaveHook) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` before saving; it may edit ``weights``.

        ``output_dir`` is the checkpoint's staging folder: files the hook writes there are
        published with the checkpoint, all at once (a crash leaves no half checkpoint).
        """
        handle = RemovableHandle(self._save_hooks)
        self._save_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: LoadHook) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` before loading."""
        handle = RemovableHandle(self._load_hooks)
        self._load_hooks[handle.id] = hook
        return handle

    def _save_dir(self, output_dir: str | os.PathLike[str] | None) -> Path:
        config = self.project_config
        if config.automatic_checkpoint_naming:
            limit = config.total_limit
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0
            ):
                raise ValueError(
                    f"project_configuration.total_limit={limit!r} would delete every checkpoint; "
                    "set it to a positive number of checkpoints to keep, or None to keep all."
                )
            if config.project_dir is None:
                raise ValueError(
                    "automatic_checkpoint_naming needs a project_dir: pass "
                    "Accelerator(project_dir=...) or ProjectConfiguration(project_dir=...)."
                )
            target = paths.checkpoint_path(config.project_dir, config.iteration)
            if target.exists():
                raise CheckpointExistsError(
                    f"Checkpoint folder {target} already exists. Set "
                    "accelerator.project_configuration.iteration to the next free number, or "
                    "remove the folder."
                )
            return target
        if output_dir is None:
            raise ValueError(
                "save_state() needs an output_dir, or a ProjectConfiguration with "
                "automatic_checkpoint_naming=True (and a project_dir)."
            )
        return Path(output_dir)

    def watch_preemption(self, save_state: Callable[[], str]) -> bool:
        """Checkpoint and exit on SIGTERM/SIGUSR1 when automatic naming is configured.

        ``save_state`` (a bound method, held weakly) saves on every process. Returns whether
        the watcher is active (it needs automatic_checkpoint_naming, a project_dir and the
        main thread).
        """
        config = self.project_config
        if not config.automatic_checkpoint_naming or config.project_dir is None:
            return False
        method = weakref.WeakMethod(save_state)

        def save() -> str:
            bound = method()
            if bound is None:
                raise RuntimeError("The Accelerator that asked for preemption checkpoints is gone.")
            return bound()

        watcher = PreemptionWatcher(save)
        if not watcher.install():
            return False
        self._watcher = watcher
        weakref.finalize(self, watcher.uninstall)
        return True

    def finish(self) -> None:
        """End of training: finish a pending save and stop watching for preemption."""
        self.wait()
        paths.wait_for_removals()  # replaced checkpoint folders are gone when training ends
        if self._watcher is not None:
            self._watcher.uninstall()
            self._watcher = None

    def wait(self) -> None:
        """Finish a pending asynchronous save on every process, raising if any failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            finish_async_save(pending)

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None,
        contents: CheckpointContents,
        models: list[torch.nn.Module],
        *,
        layout: CheckpointLayout[Any] | None = None,
        step: int,
        safe_serialization: bool = True,
        async_save: bool = False,
    ) -> str:
        """Save everything in ``contents`` (``models`` are what the hooks see); return the folder."""
        self.wait()
        target = self._save_dir(output_dir)
        hooks = list(self._save_hooks.values())

        def run_hooks(folder: Path) -> None:
            for hook in hooks:
                hook(models, contents.model_states, str(folder))

        config = self.project_config
        automatic = config.automatic_checkpoint_naming
        result = save_contents(
            target,
            contents,
            layout=layout,
            step=step,
            safe_serialization=safe_serialization,
            save_on_each_node=config.save_on_each_node,
            async_save=async_save,
            total_limit=config.total_limit if automatic else None,
            project_dir=config.project_dir if automatic else None,
            host_buffers=self._host_buffers,
            pre_hooks=run_hooks if hooks else None,
        )
        if isinstance(result, PendingSave):
            self._pending = result
        config.iteration += 1
        return str(target.absolute())

    def _load_dir(self, input_dir: str | os.PathLike[str] | None) -> Path:
        if input_dir is not None:
            return Path(input_dir)
        config = self.project_config
        if not config.automatic_checkpoint_naming or config.project_dir is None:
            raise ValueError(
                "load_state() without input_dir needs automatic_checkpoint_naming=True and a "
                "project_dir; otherwise pass the folder save_state wrote."
            )
        newest = paths.newest_complete_checkpoint(config.project_dir)
        if newest is None:
            raise CheckpointNotFoundError(
                f"No complete checkpoint under {Path(config.project_dir) / 'checkpoints'}. "
                "Save one with save_state() first, or pass input_dir."
            )
        return newest

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None,
        contents: CheckpointContents,
        *,
        layout: CheckpointLayout[Any] | None = None,
        map_location: str | torch.device = "cpu",
        strict: bool = True,
    ) -> dict[str, Any]:
        """Load a checkpoint into ``contents``; return its saved attributes (``step``)."""
        self.wait()
        folder = self._load_dir(input_dir)
        for hook in self._load_hooks.values():
            hook(contents.models, str(folder))
        attributes = load_contents(
            folder, contents, layout=layout, map_location=map_location, strict=strict
        )
        number = paths.checkpoint_number(folder)
        if self.project_config.automatic_checkpoint_naming and number is not None:
            # The next automatic save goes after the loaded one, not over it.
            self.project_config.iteration = number + 1
        return attributes

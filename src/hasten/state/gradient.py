"""`GradientState`: when to synchronise gradients, and where the current dataloader stands.

Shared by every instance (like `PartialState`). The accumulation settings come from a
`GradientAccumulationPlugin`; the dataloaders register themselves while they iterate so the
training loop knows when the last batch arrives.
"""

from __future__ import annotations

import weakref
from typing import Any

from hasten.config import envvars
from hasten.state._shared import SharedState

__all__ = ["GradientState"]

# What each setting is when `plugin_kwargs` (only the plugin's non-default fields) lacks it:
# the defaults of GradientAccumulationPlugin. (Accelerate falls back to False for
# adjust_scheduler, which makes the plugin's default True unreachable.)
_PLUGIN_DEFAULTS: dict[str, Any] = {
    "num_steps": 1,
    "adjust_scheduler": True,
    "sync_with_dataloader": True,
    "sync_each_batch": False,
}
# Attributes an unpickled state lacks when Accelerate wrote it, with their starting values.
_RESTORED_DEFAULTS: dict[str, Any] = {
    "sync_gradients": True,
    "plugin_kwargs": {},
    "_end_of_dataloader": False,
    "_remainder": -1,
    "_is_xla_gradients_synced": False,
    "_fsdp": False,
}


class GradientState(SharedState):
    """Gradient-synchronisation flags and the active dataloader, shared by every instance.

    Args:
        gradient_accumulation_plugin: a `GradientAccumulationPlugin`; its non-default fields
            become `plugin_kwargs` (they may be updated by a later instance).

    Example:
        >>> state = GradientState()
        >>> state.sync_gradients, state.num_steps, state.in_dataloader
        (True, 1, False)
    """

    # The loaders being iterated are referenced weakly; an unpickled state iterates none.
    _transient = frozenset({"_dataloader_references_ref"})

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        self.__dict__ = shared = self._shared_state
        if not shared:
            self.sync_gradients = True
            self._dataloader_references_ref: list[weakref.ref[Any] | None] = [None]
            self.plugin_kwargs: dict[str, Any] = {}
            self._end_of_dataloader = False
            self._remainder = -1
            self._is_xla_gradients_synced = False
            self._fsdp = bool(envvars.setting("ACCELERATE_USE_FSDP"))
        if gradient_accumulation_plugin is not None:
            plugin_kwargs = gradient_accumulation_plugin.to_kwargs()
            if plugin_kwargs != self.plugin_kwargs:
                self.plugin_kwargs = plugin_kwargs

    @property
    def initialized(self) -> bool:
        """Whether the shared state has been set up."""
        return bool(self._shared_state)

    def _restore(self) -> None:
        """Complete an unpickled state (Accelerate's keeps fewer attributes)."""
        state = self.__dict__
        state["_dataloader_references_ref"] = [None]
        for name, default in _RESTORED_DEFAULTS.items():
            state.setdefault(name, dict(default) if isinstance(default, dict) else default)

    @property
    def num_steps(self) -> int:
        """Number of batches whose gradients are accumulated before a step."""
        return self.plugin_kwargs.get("num_steps") or _PLUGIN_DEFAULTS["num_steps"]

    @property
    def adjust_scheduler(self) -> bool:
        """Whether the scheduler is stepped to account for accumulation."""
        return self.plugin_kwargs.get("adjust_scheduler", _PLUGIN_DEFAULTS["adjust_scheduler"])

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether gradients are synchronised (and the count reset) at the end of the data."""
        return self.plugin_kwargs.get(
            "sync_with_dataloader", _PLUGIN_DEFAULTS["sync_with_dataloader"]
        )

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients are synchronised on every batch, even while accumulating."""
        return self.plugin_kwargs.get("sync_each_batch", _PLUGIN_DEFAULTS["sync_each_batch"])

    @property
    def dataloader_references(self) -> list[Any]:
        """The dataloaders being iterated, innermost last (``None`` at the bottom)."""
        return [ref() if ref is not None else None for ref in self._dataloader_references_ref]

    @dataloader_references.setter
    def dataloader_references(self, references: list[Any]) -> None:
        # Weak references: a finished dataloader must not be kept alive by the shared state.
        self._dataloader_references_ref = [
            weakref.ref(loader) if loader is not None else None for loader in references
        ]

    @property
    def active_dataloader(self) -> Any:
        """The dataloader being iterated now, or None."""
        ref = self._dataloader_references_ref[-1]
        return ref() if ref is not None else None

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared dataloader is being iterated."""
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the active dataloader has yielded its last batch."""
        loader = self.active_dataloader
        if loader is None:
            return False
        return bool(getattr(loader, "end_of_dataloader", self._end_of_dataloader))

    @property
    def remainder(self) -> int:
        """Samples the active dataloader added to even out the last batch (-1 outside one)."""
        loader = self.active_dataloader
        if loader is None:
            return -1
        return int(getattr(loader, "remainder", self._remainder))

    @property
    def is_xla_gradients_synced(self) -> bool:
        """Whether XLA gradients were already reduced this step (always True under FSDP)."""
        return self._fsdp or self._is_xla_gradients_synced

    @is_xla_gradients_synced.setter
    def is_xla_gradients_synced(self, is_synced: bool) -> None:
        self._is_xla_gradients_synced = is_synced

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        """Set whether the next backward synchronises gradients (called by the Accelerator)."""
        self.sync_gradients = sync_gradients

    def _set_end_of_dataloader(self, end_of_dataloader: bool) -> None:
        """Record the end of data for a dataloader that does not track it itself."""
        self._end_of_dataloader = end_of_dataloader

    def _set_remainder(self, remainder: int) -> None:
        """Record the padding of the last batch for a dataloader that does not track it."""
        self._remainder = remainder

    def _add_dataloader(self, dataloader: Any) -> None:
        """Push `dataloader` as the active one (called when its iteration starts)."""
        self._dataloader_references_ref = [
            *self._dataloader_references_ref,
            weakref.ref(dataloader),
        ]

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Drop `dataloader` (called when its iteration ends)."""
        self._dataloader_references_ref = [
            ref for ref in self._dataloader_references_ref if ref is None or ref() is not dataloader
        ]

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state (Accelerate's name; tests use `reset_state()`)."""
        GradientState._clear_shared()

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {self.plugin_kwargs}\n"
        )

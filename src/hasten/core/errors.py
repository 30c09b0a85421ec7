"""Exceptions that are both Accelerate's type and the more precise one hasten used to raise.

Accelerate raises `ValueError` in a few places where the natural Python type is another one
(a missing folder, an object of the wrong kind, a state used before it exists). Scripts and
tests catch Accelerate's type, so these classes derive from both: ``except ValueError`` and
``except FileNotFoundError`` (or `TypeError`, `FileExistsError`, `RuntimeError`) both work.
"""

from __future__ import annotations

__all__ = [
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "ModelNotLocalError",
    "NotCheckpointableError",
    "ProcessGroupDestroyedError",
    "StateNotInitializedError",
    "TrackerClassError",
]


class NotCheckpointableError(ValueError, TypeError):
    """An object given to `register_for_checkpointing` lacks state_dict/load_state_dict."""


class CheckpointNotFoundError(ValueError, FileNotFoundError):
    """`load_state` was pointed at a folder that does not exist."""


class CheckpointExistsError(ValueError, FileExistsError):
    """Automatic checkpoint naming would overwrite an existing folder."""


class StateNotInitializedError(ValueError, RuntimeError):
    """A `PartialState` helper was used before the state was set up."""


class ProcessGroupDestroyedError(ValueError, RuntimeError):
    """A collective or barrier ran after `end_training()` destroyed the process group.

    torch raises `ValueError` for a missing default group, which is what Accelerate users see.
    """


class TrackerClassError(ValueError, TypeError):
    """`register_tracker_class` was given something that is not a `GeneralTracker` subclass."""


class ModelNotLocalError(ValueError, OSError):
    """`estimate-memory` was given a name that is no local config (hasten never downloads).

    An `OSError` too: Accelerate's lookup of an unknown or gated repo raises one.
    """

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
    "NotCheckpointableError",
    "StateNotInitializedError",
]


class NotCheckpointableError(ValueError, TypeError):
    """An object given to `register_for_checkpointing` lacks state_dict/load_state_dict."""


class CheckpointNotFoundError(ValueError, FileNotFoundError):
    """`load_state` was pointed at a folder that does not exist."""


class CheckpointExistsError(ValueError, FileExistsError):
    """Automatic checkpoint naming would overwrite an existing folder."""


class StateNotInitializedError(ValueError, RuntimeError):
    """A `PartialState` helper was used before the state was set up."""

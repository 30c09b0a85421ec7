"""Checkpoints on disk: file I/O that is atomic and safe to load (more arrives with save_state)."""

from hasten.checkpointing.io import UnsafeCheckpointError, load, save

__all__ = ["UnsafeCheckpointError", "load", "save"]

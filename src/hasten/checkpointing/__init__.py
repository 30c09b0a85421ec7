"""Checkpoints on disk: crash-safe save_state/load_state, save_model, and safe file I/O.

Accelerate's documented names for this area (``save_accelerator_state``,
``load_accelerator_state``, ``save``, ``load``) are re-exported here.
"""

from hasten.checkpointing.io import UnsafeCheckpointError, load, save
from hasten.checkpointing.manager import CheckpointManager, check_checkpointable
from hasten.checkpointing.manifest import CorruptCheckpointError
from hasten.checkpointing.model import save_model_weights
from hasten.checkpointing.preemption import PREEMPTED_EXIT_CODE
from hasten.checkpointing.sharded import load_sharded_state, save_sharded_state
from hasten.checkpointing.state import (
    CheckpointContents,
    load_accelerator_state,
    save_accelerator_state,
)

__all__ = [
    "CheckpointContents",
    "CheckpointManager",
    "CorruptCheckpointError",
    "PREEMPTED_EXIT_CODE",
    "UnsafeCheckpointError",
    "check_checkpointable",
    "load",
    "load_accelerator_state",
    "load_sharded_state",
    "save",
    "save_accelerator_state",
    "save_model_weights",
    "save_sharded_state",
]

"""Checkpoints on disk: crash-safe save_state/load_state, save_model, and safe file I/O.

Accelerate's documented names for this area (``save_accelerator_state``,
``load_accelerator_state``, ``save``, ``load``) are re-exported here, lazily: the sharded
(torch.distributed.checkpoint) format and the rest load only when used.
"""

from hasten.core.lazy import lazy_namespace

_TABLE: dict[str, list[str]] = {
    "hasten.checkpointing.layouts.base": ["CheckpointContents"],
    "hasten.checkpointing.storage.io": ["UnsafeCheckpointError", "load", "save"],
    "hasten.checkpointing.manager": ["CheckpointManager", "check_checkpointable"],
    "hasten.checkpointing.storage.manifest": ["CorruptCheckpointError"],
    "hasten.checkpointing.model": ["save_model_weights"],
    "hasten.checkpointing.preemption": ["PREEMPTED_EXIT_CODE"],
    "hasten.checkpointing.functional": [
        "load_accelerator_state",
        "load_custom_state",
        "save_accelerator_state",
        "save_custom_state",
    ],
    "hasten.checkpointing.dcp_folders": ["load_sharded_state", "save_sharded_state"],
}

__getattr__, __dir__ = lazy_namespace(__name__, _TABLE, globals())

__all__ = sorted(name for names in _TABLE.values() for name in names)

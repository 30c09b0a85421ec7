"""The middle floor of checkpoints: one object per way of writing models and optimizers.

`ReplicatedLayout` (one copy from the main process, loaded in place), `GatheredLayout` (split
parameters gathered to one copy), `ShardedLayout` (every process's shards through DCP) and
`EngineLayout` (an engine's own checkpoint), siblings sharing `model_files`, `optimizer_files`
and `dcp_parts`, each build what a call holds (`contents`), plan and
write a save (`plan`, `write`) and read one back (`load`), over the storage floor below; what is on disk decides how a load reads (`read`). A
strategy declares its layout (`checkpoint_layout`); `hasten.checkpointing.state` writes the
parts every checkpoint has, then hands the models and optimizers to it.
"""

from hasten.core.lazy import lazy_namespace

_TABLE: dict[str, list[str]] = {
    "hasten.checkpointing.layouts.base": [
        "CheckpointContents",
        "CheckpointLayout",
        "PreparedObjects",
    ],
    "hasten.checkpointing.layouts.dcp_shards": ["ShardedLayout"],
    "hasten.checkpointing.layouts.engine": ["EngineLayout"],
    "hasten.checkpointing.layouts.factory": ["checkpoint_layout", "default_layout"],
    "hasten.checkpointing.layouts.gathered": ["GatheredLayout"],
    "hasten.checkpointing.layouts.read": ["formats_on_disk", "read_from_disk"],
    "hasten.checkpointing.layouts.replicated": ["ReplicatedLayout"],
}

__getattr__, __dir__ = lazy_namespace(__name__, _TABLE, globals())

__all__ = sorted(name for names in _TABLE.values() for name in names)

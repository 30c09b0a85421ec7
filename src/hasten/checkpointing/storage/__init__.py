"""The storage floor of checkpoints: how bytes reach the disk safely and come back verified.

Atomic files and early writeback (`io`), block checksums and the manifest (`checksum`,
`manifest`), where files go and how a staging folder is published (`paths`), the writer
(`writer`) and what the processes agree on over the process group (`agreement`), verified
parallel reads (`reader`, `scatter`), safetensors and restricted unpicklers (`tensors`,
`plain_pickle`), engine-written files (`engine_files`), the DCP storage adapter
(`dcp_storage`, `dcp_safe`) and every DCP save and load, crash-safe and verified (`dcp`).
Nothing here knows about models, optimizers or strategies: the layouts above decide what goes
into which file.
"""

from hasten.core.lazy import lazy_namespace

# No names of its own: its modules are imported where used, and resolve as attributes.
__getattr__, __dir__ = lazy_namespace(__name__, {}, globals())

__all__: list[str] = []

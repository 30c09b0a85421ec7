"""Context parallelism: shard sequence buffers over the ``cp`` mesh inside a context (CUDA only).

`maybe_context_parallel` wraps torch's ``context_parallel``: inside it, the given buffers are
split along their sequence dimension across the ``cp`` group and SDPA attention exchanges keys
and values with the strategy the `TorchContextParallelConfig` chose (``allgather`` or
``alltoall``, set once per process by `configure_context_parallel`). Without context parallelism
it does nothing. torch has no context-parallel sharding for the CPU attention kernels, so a
``cp_size > 1`` job on the CPU is refused when the mesh is built (`state.mesh`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hasten.state.mesh import submesh

__all__ = ["configure_context_parallel", "maybe_context_parallel"]

_configured: list[str] = []


def configure_context_parallel(config: Any) -> None:
    """Select the key/value exchange of the cp handler (once per process)."""
    if config is None or not config.cp_enabled:
        return
    strategy = str(config.cp_handler.cp_comm_strategy)
    if _configured == [strategy]:
        return
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(strategy)
    _configured[:] = [strategy]


@contextlib.contextmanager
def maybe_context_parallel(
    config: Any,
    mesh: Any,
    buffers: list[torch.Tensor] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
) -> Iterator[None]:
    """Shard ``buffers`` along ``buffer_seq_dims`` over the ``cp`` mesh for the block.

    Buffers in ``no_restore_buffers`` keep their shard after the block (e.g. inputs no longer
    needed); the others get their full content back.

    Raises:
        ValueError: ``buffers`` and ``buffer_seq_dims`` differ in length, or ``mesh`` has no
            ``cp`` dimension.
    """
    if config is None or not config.cp_enabled:
        yield
        return
    buffers = list(buffers or [])
    seq_dims = list(buffer_seq_dims or [])
    if len(buffers) != len(seq_dims):
        raise ValueError(
            f"maybe_context_parallel got {len(buffers)} buffers but {len(seq_dims)} "
            "buffer_seq_dims; give one sequence dimension per buffer"
        )
    cp_mesh = submesh(mesh, "cp")
    if cp_mesh is None:
        raise ValueError(
            "maybe_context_parallel needs the job's mesh with a 'cp' dimension; create the "
            "Accelerator with parallelism_config=ParallelismConfig(cp_size=...) first"
        )
    from torch.distributed.tensor.experimental import context_parallel

    configure_context_parallel(config)
    with context_parallel(
        cp_mesh,
        buffers=buffers,
        buffer_seq_dims=seq_dims,
        no_restore_buffers=no_restore_buffers,
    ):
        yield

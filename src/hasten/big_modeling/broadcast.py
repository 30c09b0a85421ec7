"""`load_checkpoint_in_model(broadcast_from_rank0=True)`: rank 0 reads, every rank receives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from hasten.big_modeling.loading import Loader

__all__ = ["load_broadcast"]


def _wire_device() -> torch.device:
    # NCCL moves only accelerator tensors; gloo and the others move cpu tensors
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def load_broadcast(
    loader: Loader,
    list_files: Callable[[], list[str]],
    read: Callable[[str], Mapping[str, torch.Tensor]],
) -> None:
    """Rank 0 lists and reads each shard and broadcasts it tensor by tensor; all ranks place them.

    Raises:
        RuntimeError: if no process group is initialized.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "broadcast_from_rank0=True needs an initialized process group: call "
            "torch.distributed.init_process_group (or create an Accelerator) first."
        )
    wire = _wire_device()
    files = list_files() if dist.get_rank() == 0 else []
    count: list[Any] = [len(files)]
    dist.broadcast_object_list(count, src=0)
    for shard in range(count[0]):
        state = read(files[shard]) if dist.get_rank() == 0 else {}
        header: list[Any] = [[(n, tuple(t.shape), t.dtype) for n, t in state.items()]]
        dist.broadcast_object_list(header, src=0)
        received: dict[str, torch.Tensor] = {}
        for name, shape, dtype in header[0]:
            if dist.get_rank() == 0:
                tensor = state[name].contiguous().to(wire)
            else:
                tensor = torch.empty(shape, dtype=dtype, device=wire)
            dist.broadcast(tensor, src=0)
            received[name] = tensor
        loader.load_tensors(received)

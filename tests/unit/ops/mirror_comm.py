"""A stand-in communicator for two processes whose peer holds exactly the same data.

It lets the single-process unit tests drive the multi-process code paths (flattening, bucketing,
rebuilding, debug checks) without starting processes: gathering returns the data twice, a sum
doubles it, a broadcast from the other rank fills sevens.
"""

from __future__ import annotations

from typing import Any

import torch


class MirrorComm:
    """Pretend to be rank ``process_index`` of 2 processes holding identical data."""

    num_processes = 2

    def __init__(self, process_index: int = 0, debug: bool = False, peer: Any = None) -> None:
        self.process_index = process_index
        self.debug = debug
        self.device = torch.device("cpu")
        self.peer_object = peer  # what the other rank answers in all_gather_object, if set
        self.calls: list[tuple[str, str]] = []

    def all_gather(self, flat: torch.Tensor, op: str, data: Any = None) -> torch.Tensor:
        self.calls.append(("all_gather", op))
        return torch.cat([flat, flat])

    def all_reduce(self, flat: torch.Tensor, reduce_op: str, op: str, data: Any = None) -> None:
        self.calls.append(("all_reduce", op))
        if reduce_op == "sum":
            flat *= 2

    def broadcast(self, flat: torch.Tensor, src: int, op: str, data: Any = None) -> None:
        self.calls.append(("broadcast", op))
        if self.process_index != src:
            flat.fill_(7)

    def all_gather_object(self, obj: Any, op: str) -> list[Any]:
        self.calls.append(("all_gather_object", op))
        peer = obj if self.peer_object is None else self.peer_object
        return [obj, peer] if self.process_index == 0 else [peer, obj]

    def broadcast_object_list(self, objects: list[Any], src: int, op: str) -> None:
        self.calls.append(("broadcast_object_list", op))
        if self.process_index != src:
            objects[:] = ["from", "source"][: len(objects)]

"""Communicators: the one object that moves flat buffers between processes.

The collectives in `hasten.ops.collectives` never ask "which backend am I on?" per call; they ask
`current_comm()` for the communicator chosen when the process group appeared (`LocalComm` for a
single process, `TorchComm` over torch.distributed) and call its methods. Every `TorchComm` call
goes through `hasten.state.recorder.guarded`, so a timeout names what each rank was doing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hasten.state._shared import register_reset_hook
from hasten.state.recorder import guarded

__all__ = [
    "Communicator",
    "LocalComm",
    "TorchComm",
    "current_comm",
    "data_parallel_comm",
    "group_comm",
    "reset_comm",
    "set_comm",
]

_REDUCE_OPS: dict[str, Any] = {}
_GroupMember: Any = None
_gather_into_tensor: Any = None
if dist.is_available():
    from torch.distributed.distributed_c10d import GroupMember

    _REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    _GroupMember = GroupMember
    # torch >= 2.10 renames all_gather_into_tensor (and warns on the old name)
    _gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Communicator(Protocol):
    """Moves flat, contiguous tensors (and picklable objects) between the processes of a job."""

    num_processes: int
    process_index: int
    device: torch.device

    @property
    def debug(self) -> bool:
        """Whether collectives check that every process passes matching shapes first."""

    def all_gather(self, flat: torch.Tensor, op: str, data: Any = None) -> torch.Tensor:
        """Return every process's ``flat`` concatenated in process order (one new 1-D buffer)."""

    def all_reduce(self, flat: torch.Tensor, reduce_op: str, op: str, data: Any = None) -> None:
        """Reduce ``flat`` in place across processes with ``reduce_op`` (sum/max/min)."""

    def broadcast(self, flat: torch.Tensor, src: int, op: str, data: Any = None) -> None:
        """Overwrite ``flat`` in place with process ``src``'s copy."""

    def all_gather_object(self, obj: Any, op: str) -> list[Any]:
        """Return the list of every process's ``obj``, in process order."""

    def broadcast_object_list(self, objects: list[Any], src: int, op: str) -> None:
        """Overwrite ``objects`` in place with process ``src``'s items."""


class LocalComm:
    """The communicator of a single process: every collective is the identity."""

    num_processes = 1
    process_index = 0
    debug = False

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")

    def all_gather(self, flat: torch.Tensor, op: str, data: Any = None) -> torch.Tensor:
        """Return ``flat`` itself (one process: nothing to gather)."""
        return flat

    def all_reduce(self, flat: torch.Tensor, reduce_op: str, op: str, data: Any = None) -> None:
        """Do nothing: the reduction over one process is its own value."""

    def broadcast(self, flat: torch.Tensor, src: int, op: str, data: Any = None) -> None:
        """Do nothing: the only process already holds the data."""

    def all_gather_object(self, obj: Any, op: str) -> list[Any]:
        """Return ``[obj]``."""
        return [obj]

    def broadcast_object_list(self, objects: list[Any], src: int, op: str) -> None:
        """Do nothing: the only process already holds the objects."""

    def __repr__(self) -> str:
        return "LocalComm()"


class TorchComm:
    """torch.distributed over the default process group (gloo, nccl, xccl, hccl, ...)."""

    def __init__(
        self,
        num_processes: int,
        process_index: int,
        backend: str,
        device: torch.device,
        debug: bool = False,
        group: Any = None,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        self.num_processes = num_processes
        self.process_index = process_index
        self.backend = backend
        self.device = device
        self._debug = debug
        # The process state's shared dict: its ``debug`` is read at each collective, so
        # ``PartialState().debug = True`` takes effect at once (Accelerate's test_ops does it).
        self._state = state
        # None: the default group; else a subgroup (e.g. the data-parallel replicas of a mesh),
        # whose members are numbered 0..num_processes-1 here and in `broadcast`'s ``src``.
        self.group = group
        self._on: dict[str, Any] = {} if group is None else {"group": group}
        # Gather straight into one buffer; older gloo builds lack it and we fall back once.
        self._gather_into = True

    @property
    def debug(self) -> bool:
        """Whether collectives check shapes first (ACCELERATE_DEBUG_MODE or ``state.debug``)."""
        if self._state is not None:
            return bool(self._state.get("debug", False))
        return self._debug

    def all_gather(self, flat: torch.Tensor, op: str, data: Any = None) -> torch.Tensor:
        """Gather ``flat`` from every process into one rank-major buffer."""
        out = flat.new_empty(self.num_processes * flat.numel())
        if self._gather_into:
            try:
                guarded(op, lambda: _gather_into_tensor(out, flat, **self._on), shapes=data)
                return out
            except RuntimeError as err:
                # raised locally before any traffic, identically on every rank
                if "no support" not in str(err):
                    raise
                self._gather_into = False
        rows = list(out.view(self.num_processes, -1).unbind(0))
        guarded(op, lambda: dist.all_gather(rows, flat, **self._on), shapes=data)
        return out

    def all_reduce(self, flat: torch.Tensor, reduce_op: str, op: str, data: Any = None) -> None:
        """Reduce ``flat`` in place."""
        red = _REDUCE_OPS[reduce_op]
        guarded(op, lambda: dist.all_reduce(flat, red, **self._on), shapes=data)

    def _source(self, src: int) -> dict[str, Any]:
        """``src`` for torch: a global rank on the default group, else an index in the group."""
        return {"src": src} if self.group is None else {"group_src": src, "group": self.group}

    def broadcast(self, flat: torch.Tensor, src: int, op: str, data: Any = None) -> None:
        """Broadcast ``flat`` in place from ``src``."""
        guarded(op, lambda: dist.broadcast(flat, **self._source(src)), shapes=data)

    def all_gather_object(self, obj: Any, op: str) -> list[Any]:
        """Gather one picklable object per process."""
        out: list[Any] = [None] * self.num_processes
        guarded(op, lambda: dist.all_gather_object(out, obj, **self._on), shapes="object")
        return out

    def broadcast_object_list(self, objects: list[Any], src: int, op: str) -> None:
        """Broadcast a list of picklable objects in place from ``src``."""
        guarded(
            op,
            lambda: dist.broadcast_object_list(objects, **self._source(src)),
            shapes=f"list of {len(objects)} objects",
        )

    def __repr__(self) -> str:
        return (
            f"TorchComm(num_processes={self.num_processes}, process_index={self.process_index}, "
            f"backend={self.backend!r}, debug={self.debug})"
        )


# (default process group it was chosen for, the communicator); re-chosen only when the group changes
_chosen: tuple[Callable[[], Any], Communicator] | None = None


def _no_group() -> None:
    return None


def _world() -> Any:
    return None if _GroupMember is None else _GroupMember.WORLD


def _choose() -> Communicator:
    """Pick the communicator from the process state (initialising it from the environment)."""
    from hasten.state import PartialState

    state = PartialState()
    group = _world()
    if group is None:
        # After end_training() destroyed the group, a collective must fail, not act alone.
        state._check_process_group("This collective")
        return LocalComm(torch.device(state.device))
    # object collectives and rng states travel on the device the backend works on
    backend = str(dist.get_backend())
    device = torch.device("cpu") if backend == "gloo" else torch.device(state.device)
    return TorchComm(
        num_processes=dist.get_world_size(),
        process_index=dist.get_rank(),
        backend=backend,
        device=device,
        state=state.__dict__,
    )


def group_comm(group: Any) -> Communicator:
    """A communicator over the processes of ``group`` (a subgroup such as a mesh dimension's).

    Built once by the caller (e.g. the Accelerator for its data-parallel replicas).
    """
    base = current_comm()
    size = dist.get_world_size(group)
    if size == 1:
        return LocalComm(base.device)
    return TorchComm(
        num_processes=size,
        process_index=dist.get_rank(group),
        backend=str(dist.get_backend(group)),
        device=base.device,
        debug=base.debug,
        group=group,
        state=getattr(base, "_state", None),
    )


def data_parallel_comm(mesh: Any) -> Communicator | None:
    """The communicator over ``mesh``'s data-parallel replicas, when it differs from the world.

    None when there is no mesh or every process is its own replica (plain data parallelism);
    with tensor/context-parallel dimensions, their members hold the same data, so metrics and
    reductions count each replica once.
    """
    from hasten.state.mesh import submesh

    if mesh is None or not set(mesh.mesh_dim_names or ()) & {"tp", "cp", "sp"}:
        return None
    dp = submesh(mesh, "dp")
    if dp is None:
        return LocalComm(current_comm().device)
    return group_comm(dp.get_group())


def current_comm() -> Communicator:
    """Return this process's communicator, choosing it once per default process group."""
    chosen, world = _chosen, _world()
    # (a destroyed group's dead weak reference also reads None: only a LocalComm matches None)
    if (
        chosen is not None
        and chosen[0]() is world
        and (world is not None or chosen[0] is _no_group)
    ):
        return chosen[1]
    return set_comm(_choose())


def set_comm(comm: Communicator) -> Communicator:
    """Use ``comm`` for collectives until the default process group changes; return it."""
    global _chosen
    world = _world()
    # A weak reference: holding the group would keep gloo's threads alive past
    # destroy_process_group(), and a worker could then abort at interpreter exit.
    _chosen = (_no_group if world is None else weakref.ref(world), comm)
    return comm


def reset_comm() -> None:
    """Forget the chosen communicator (the next collective chooses again)."""
    global _chosen
    _chosen = None


# reset_state() (tests, fresh launches) also forgets the communicator chosen for the old state
register_reset_hook(reset_comm)

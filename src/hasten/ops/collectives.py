"""Collectives over nested structures: gather, reduce, broadcast, padding, object exchange.

Each function takes Accelerate's signature and keeps the container types of its input. The
communicator is chosen once (`hasten.ops.comm.current_comm`); on one process every collective is
the identity. Tensors that share a dtype and device travel in one buffer per call, so a dict of
ten small tensors costs one collective, not ten; results are identical to per-tensor calls.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from hasten.core.nested import recursively_apply
from hasten.ops.comm import Communicator, current_comm
from hasten.ops.debug import check_operation
from hasten.ops.flat import buckets, flatten

__all__ = [
    "CannotPadNestedTensorWarning",
    "broadcast",
    "broadcast_object_list",
    "copy_tensor_to_devices",
    "gather",
    "gather_object",
    "gather_object_on",
    "gather_on",
    "pad_across_processes",
    "pad_input_tensors",
    "reduce",
    "reduce_on",
]

_REDUCTIONS = ("mean", "sum", "max", "none")
_GATHER_HINT = "Use `gather_object` for picklable Python objects."


class CannotPadNestedTensorWarning(UserWarning):
    """A nested (jagged) tensor was left unpadded: its per-row sizes are unknown here."""


def _check_source(from_process: int, comm: Communicator, op: str) -> None:
    if not 0 <= from_process < comm.num_processes:
        raise ValueError(
            f"{op}(from_process={from_process!r}) is out of range: this job has "
            f"{comm.num_processes} processes, so use 0..{comm.num_processes - 1}."
        )


def _gather_group(comm: Communicator, group: list[torch.Tensor], data: Any) -> list[torch.Tensor]:
    world = comm.num_processes
    shapes = [t.shape if t.dim() else torch.Size([1]) for t in group]
    # Gathered values carry no autograd history (as with torch.distributed.all_gather), and
    # gloo's gather-into-one-buffer fails outright on inputs that require grad (e.g. a loss).
    if len(group) == 1:
        buffer = comm.all_gather(group[0].detach().reshape(-1), "gather", data)
        return [buffer.view(world * shapes[0][0], *shapes[0][1:])]
    sizes = [t.numel() for t in group]
    buffer = comm.all_gather(torch.cat([t.detach().reshape(-1) for t in group]), "gather", data)
    pieces = buffer.view(world, -1).split(sizes, dim=1)
    return [p.reshape(world * s[0], *s[1:]) for p, s in zip(pieces, shapes)]


def gather(tensor: Any) -> Any:
    """Gather the tensors of a nested structure from every process, concatenated along dim 0.

    Scalars (0-d tensors) become one row per process. On one process this returns ``tensor``.

    Raises:
        TypeError: a leaf is not a tensor (use `gather_object` for Python objects).
        DistributedOperationException: in debug mode, processes passed different shapes.
    """
    return gather_on(current_comm(), tensor)


def gather_on(comm: Communicator, tensor: Any) -> Any:
    """`gather` over the processes of ``comm`` (e.g. only the data-parallel replicas)."""
    if comm.num_processes == 1:
        return tensor
    leaves, rebuild = flatten(tensor, "gather", _GATHER_HINT)
    if comm.debug:
        check_operation(comm, "gather", tensor)
    outs: list[Any] = [None] * len(leaves)
    for group in buckets(leaves):
        for index, out in zip(group, _gather_group(comm, [leaves[i] for i in group], tensor)):
            outs[index] = out
    return rebuild(outs)


def gather_object(object: Any) -> Any:  # noqa: A002 - Accelerate's parameter name
    """Gather a picklable object from every process into one list.

    A list or tuple from each process is concatenated in process order; any other object is
    appended as one item. On one process this returns ``object`` unchanged.
    """
    return gather_object_on(current_comm(), object)


def gather_object_on(comm: Communicator, object: Any) -> Any:  # noqa: A002
    """`gather_object` over the processes of ``comm``."""
    if comm.num_processes == 1:
        return object
    if comm.debug:
        check_operation(comm, "gather_object", detail="objects")
    result: list[Any] = []
    for item in comm.all_gather_object(object, "gather_object"):
        if isinstance(item, (list, tuple)):
            result.extend(item)
        else:
            result.append(item)
    return result


def _broadcast_group(comm: Communicator, group: list[torch.Tensor], src: int, data: Any) -> None:
    if len(group) == 1 and group[0].is_contiguous():
        comm.broadcast(group[0], src, "broadcast", data)
        return
    is_source = comm.process_index == src
    if is_source:
        flat = torch.cat([t.reshape(-1) for t in group])
    else:
        flat = group[0].new_empty(sum(t.numel() for t in group))
    comm.broadcast(flat, src, "broadcast", data)
    if not is_source:
        offset = 0
        # no_grad: like torch.distributed.broadcast, overwrite parameters that require grad
        with torch.no_grad():
            for t in group:
                t.copy_(flat[offset : offset + t.numel()].view(t.shape))
                offset += t.numel()


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Overwrite the tensors of a nested structure with process ``from_process``'s values.

    The tensors are updated in place (as with ``torch.distributed.broadcast``) and returned in
    the same structure. Every process must pass tensors of the same shapes.

    Raises:
        ValueError: ``from_process`` is not a process of this job.
        TypeError: a leaf is not a tensor (use `broadcast_object_list` for Python objects).
    """
    comm = current_comm()
    if comm.num_processes == 1:
        return tensor
    _check_source(from_process, comm, "broadcast")
    leaves, rebuild = flatten(tensor, "broadcast", "Use `broadcast_object_list` for objects.")
    if comm.debug:
        check_operation(comm, "broadcast", tensor)
    for group in buckets(leaves):
        _broadcast_group(comm, [leaves[i] for i in group], from_process, tensor)
    return rebuild(leaves)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace, in place, the items of ``object_list`` by those of process ``from_process``.

    Every process must pass a list of the same length. Returns ``object_list``.

    Raises:
        ValueError: ``from_process`` is not a process of this job.
    """
    comm = current_comm()
    if comm.num_processes == 1:
        return object_list
    _check_source(from_process, comm, "broadcast_object_list")
    if comm.debug:
        check_operation(comm, "broadcast_object_list", detail=f"list of {len(object_list)}")
    comm.broadcast_object_list(object_list, from_process, "broadcast_object_list")
    return object_list


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Give every process a copy of a tensor that exactly one process holds (others pass None).

    Unlike `broadcast`, the receiving processes need not know the shape or dtype in advance.

    Raises:
        ValueError: no process, or more than one, passed a tensor.
    """
    comm = current_comm()
    if comm.num_processes == 1:
        if tensor is None:
            raise ValueError(
                "copy_tensor_to_devices(None) on a single process: pass the tensor to copy."
            )
        return tensor
    mine = None if tensor is None else (tuple(tensor.shape), tensor.dtype)
    layouts = comm.all_gather_object(mine, "copy_tensor_to_devices")
    owners = [rank for rank, layout in enumerate(layouts) if layout is not None]
    if len(owners) != 1:
        raise ValueError(
            f"copy_tensor_to_devices needs exactly one process to pass a tensor, but processes "
            f"{owners} did. Pass the tensor on one process and None on the others."
        )
    shape, dtype = layouts[owners[0]]
    if tensor is None:
        out = torch.empty(shape, dtype=dtype, device=comm.device)
    else:
        out = tensor.to(comm.device).contiguous()
    comm.broadcast(out, owners[0], "copy_tensor_to_devices", out)
    return out


def _clone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone()


def _check_reduction(reduction: str, leaves: list[torch.Tensor]) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"reduce(reduction={reduction!r}) is not supported; use one of {list(_REDUCTIONS)}."
        )
    if reduction == "mean":
        for leaf in leaves:
            if not (leaf.is_floating_point() or leaf.is_complex()):
                raise TypeError(
                    f"reduce(reduction='mean') needs floating-point tensors, got {leaf.dtype} "
                    f"(shape {list(leaf.shape)}). Convert with `.float()` or use reduction='sum'."
                )


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce the tensors of a nested structure across processes; return new tensors.

    Args:
        tensor: nested list/tuple/dict of tensors.
        reduction: ``"mean"``, ``"sum"``, ``"max"`` or ``"none"`` (``"none"`` sums without
            averaging, as in Accelerate).
        scale: accepted for compatibility; only XLA applies it.

    Raises:
        ValueError: ``reduction`` is not one of the above.
        TypeError: a leaf is not a tensor, or ``"mean"`` of an integer tensor.
    """
    return reduce_on(current_comm(), tensor, reduction)


def reduce_on(comm: Communicator, tensor: Any, reduction: str = "mean") -> Any:
    """`reduce` over the processes of ``comm`` (e.g. only the data-parallel replicas)."""
    if reduction.__class__ is not str or reduction not in _REDUCTIONS:
        # "MEAN" means mean (Accelerate would silently sum for any spelling but its own).
        reduction = str(reduction).lower()
    if comm.num_processes == 1:
        _check_reduction(reduction, [])
        return recursively_apply(_clone, tensor, error_on_other_type=True)
    leaves, rebuild = flatten(tensor, "reduce")
    _check_reduction(reduction, leaves)
    if comm.debug:
        check_operation(comm, "reduce", tensor)
    reduce_op = "max" if reduction == "max" else "sum"
    outs: list[Any] = [None] * len(leaves)
    for group in buckets(leaves):
        members = [leaves[i] for i in group]
        if len(members) == 1:
            flat = members[0].clone(memory_format=torch.contiguous_format)
        else:
            flat = torch.cat([t.reshape(-1) for t in members])
        comm.all_reduce(flat, reduce_op, "reduce", tensor)
        if reduction == "mean":
            flat /= comm.num_processes
        if len(members) == 1:
            outs[group[0]] = flat
            continue
        pieces = flat.split([t.numel() for t in members])
        for index, piece, t in zip(group, pieces, members):
            outs[index] = piece.view(t.shape)
    return rebuild(outs)


def _pad(
    tensor: torch.Tensor, dim: int, size: int, pad_index: Any, pad_first: bool
) -> torch.Tensor:
    old = tensor.shape[dim]
    if size == old:
        return tensor
    new_shape = list(tensor.shape)
    new_shape[dim] = size
    padded = tensor.new_full(new_shape, pad_index)
    start = size - old if pad_first else 0
    padded.narrow(dim, start, old).copy_(tensor)
    return padded


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Pad the tensors of a nested structure along ``dim`` to their largest size on any process.

    Makes tensors of uneven length safe to `gather`. Tensors with fewer than ``dim + 1``
    dimensions are returned unchanged; nested (jagged) tensors are left as they are, with a
    `CannotPadNestedTensorWarning`.

    Raises:
        TypeError: a leaf is not a tensor (also on a single process, as in Accelerate).
    """
    comm = current_comm()
    # non-tensors are rejected and nested tensors warned about on one process too, so a script
    # behaves the same on one process as on many (as in Accelerate)
    leaves, rebuild = flatten(tensor, "pad_across_processes")
    targets: list[int] = []
    for index, leaf in enumerate(leaves):
        if getattr(leaf, "is_nested", False):
            warnings.warn(
                "pad_across_processes cannot pad a nested tensor without its row sizes; "
                "it is returned unpadded.",
                CannotPadNestedTensorWarning,
                stacklevel=2,
            )
        elif -leaf.dim() <= dim < leaf.dim():
            targets.append(index)
    if comm.num_processes == 1:
        return tensor
    if comm.debug:
        check_operation(comm, "pad_across_processes", tensor, masked_dim=dim)
    if not targets:
        return tensor
    first = leaves[targets[0]]
    sizes = torch.tensor([leaves[i].shape[dim] for i in targets], device=first.device)
    comm.all_reduce(sizes, "max", "pad_across_processes", tensor)
    outs = list(leaves)
    for index, size in zip(targets, sizes.tolist()):
        outs[index] = _pad(leaves[index], dim, int(size), pad_index, pad_first)
    return rebuild(outs)


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad the tensors of a nested structure with zeros along ``dim`` to a multiple of ``num_processes``.

    Used before splitting a batch between processes so every process gets the same share;
    e.g. a batch of 3 over 4 processes becomes 4 rows. Runs locally (no communication).

    Raises:
        ValueError: ``num_processes`` is not positive.
    """
    if num_processes < 1:
        raise ValueError(
            f"pad_input_tensors(num_processes={num_processes!r}) must be at least 1; pass the "
            "number of processes (or chunks) the batch will be split into."
        )
    remainder = batch_size % num_processes
    target = batch_size if remainder == 0 else batch_size + num_processes - remainder

    def pad_one(t: torch.Tensor) -> torch.Tensor:
        return _pad(t, dim, max(target, t.shape[dim]), 0, False)

    return recursively_apply(pad_one, tensor, error_on_other_type=True)

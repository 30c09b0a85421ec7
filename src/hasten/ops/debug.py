"""ACCELERATE_DEBUG_MODE: agree on shapes before every collective instead of hanging on a mismatch.

With debug mode on, each collective first exchanges a one-line signature per process (operation,
shapes, dtypes, device type) through ``all_gather_object``. When the signatures differ, every
process raises the same `DistributedOperationException`, naming each rank's shapes, so nobody is
left waiting in a collective that can never complete.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from hasten.ops.comm import Communicator, current_comm

__all__ = [
    "DistributedOperationException",
    "chained_operation",
    "check_operation",
    "signature",
    "verify_operation",
]

F = TypeVar("F", bound=Callable[..., Any])


class DistributedOperationException(ValueError):
    """Processes disagree on the collective they are running (operation, shapes or device)."""


def _tensor_signature(tensor: torch.Tensor, masked_dim: int | None) -> str:
    dims = [str(s) for s in tensor.shape]
    if masked_dim is not None and -len(dims) <= masked_dim < len(dims):
        dims[masked_dim] = "*"
    dtype = "" if tensor.dtype == torch.float32 else f" {str(tensor.dtype).replace('torch.', '')}"
    return f"tensor[{', '.join(dims)}]{dtype}"


def signature(data: Any, masked_dim: int | None = None) -> str:
    """Describe every tensor's shape and dtype in ``data`` (``masked_dim`` may differ: shown ``*``)."""
    if isinstance(data, torch.Tensor):
        return _tensor_signature(data, masked_dim)
    if isinstance(data, Mapping):
        return "{" + ", ".join(f"{k}: {signature(v, masked_dim)}" for k, v in data.items()) + "}"
    if isinstance(data, (list, tuple)):
        inner = ", ".join(signature(v, masked_dim) for v in data)
        return f"[{inner}]" if isinstance(data, list) else f"({inner})"
    return type(data).__name__


def _devices(data: Any, found: set[str]) -> set[str]:
    if isinstance(data, torch.Tensor):
        found.add(data.device.type)
    elif isinstance(data, Mapping):
        for value in data.values():
            _devices(value, found)
    elif isinstance(data, (list, tuple)):
        for value in data:
            _devices(value, found)
    return found


def check_operation(
    comm: Communicator,
    op: str,
    data: Any = None,
    *,
    detail: str | None = None,
    masked_dim: int | None = None,
) -> None:
    """Check that every process is about to run the same ``op`` on matching data.

    Args:
        comm: the communicator the collective will use.
        op: the operation name, e.g. ``"gather"``.
        data: the nested tensors about to be sent (None for object collectives).
        detail: a signature to use instead of the one computed from ``data``.
        masked_dim: a dimension allowed to differ between processes (pad_across_processes).

    Raises:
        DistributedOperationException: on every process, when any process differs.
    """
    described = detail if detail is not None else signature(data, masked_dim)
    devices = sorted(_devices(data, set())) if data is not None else []
    wrong_device = [d for d in devices if d != comm.device.type and comm.device.type != "cpu"]
    mine = (op, described, ",".join(wrong_device))
    everyone = comm.all_gather_object(mine, op=f"{op} (debug shape check)")
    if all(other == everyone[0] for other in everyone) and not any(e[2] for e in everyone):
        return
    lines = [f"rank {rank}: {o} of {d}" for rank, (o, d, _) in enumerate(everyone)]
    misplaced = [
        f"rank {rank} passed tensors on {bad} (expected {comm.device.type})"
        for rank, (_, _, bad) in enumerate(everyone)
        if bad
    ]
    raise DistributedOperationException(
        f"Cannot run `{op}`: processes disagree on what they are sending "
        f"({'; '.join(lines)}). "
        + (f"{'; '.join(misplaced)}. " if misplaced else "")
        + "Every process must call the same collective with tensors of the same shapes and "
        "dtypes; pad with `pad_across_processes` first when sizes differ (found because "
        "ACCELERATE_DEBUG_MODE is on)."
    )


def verify_operation(function: F) -> F:
    """Decorate a collective so that, in debug mode, processes first agree on its input's shapes.

    The input is the ``tensor`` keyword or the first positional argument. With one process or
    ``ACCELERATE_DEBUG_MODE`` off, the call goes straight through (one attribute read).

    Raises:
        DistributedOperationException: on every process, when shapes, dtypes or devices differ.
    """
    operation = f"{function.__module__}.{function.__name__}"

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        comm = current_comm()
        if comm.num_processes > 1 and comm.debug:
            check_operation(comm, operation, kwargs["tensor"] if "tensor" in kwargs else args[0])
        return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def chained_operation(function: F) -> F:
    """Decorate a function built on collectives so a shape mismatch inside names it too.

    A `DistributedOperationException` raised within is re-raised naming `function`, chained
    to the original (which names each process's shapes).
    """
    operation = f"{function.__module__}.{function.__name__}"

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as exc:
            raise DistributedOperationException(
                f"Error found while calling `{operation}`. Please see the earlier error for more "
                "details."
            ) from exc

    return wrapper  # type: ignore[return-value]

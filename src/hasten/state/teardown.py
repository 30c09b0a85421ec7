"""How the process groups hasten made end: destroyed by `end_training()`, or at interpreter exit.

A gloo group's C++ destructor joins its worker threads while the caller holds the GIL. Since torch
2.13 the work of a collective issued during ``backward`` (DDP's gradient all-reduce) carries the
backward's context object, and the worker thread that drops the last reference to such a work
needs the GIL to release it. When the group's last reference goes while a worker is doing that
(DDP's reducer, freed with the model after ``destroy_process_group()``), each thread waits on the
other: the process hangs. hasten therefore keeps every gloo group it destroys ("retired") until
it makes the next group, or until interpreter exit, when the group's threads have long been idle,
and lets them drain before releasing it (`release_retired`).
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

__all__ = ["destroy_group", "release_retired", "remember_made_group", "retired_group_count"]

logger = logging.getLogger(__name__)

# Long enough for gloo's worker threads to drop the works they still hold (microseconds when the
# machine is idle), short enough not to be felt at exit.
_DRAIN_S = 0.05

# The gloo group hasten made, held weakly: destroyed at interpreter exit if still alive.
_made_group: list[Callable[[], Any]] = []
# Gloo groups hasten destroyed, kept alive until the next group or exit (module docstring).
_retired: list[Any] = []


def remember_made_group(backend: str) -> None:
    """Record the default group hasten just made, to destroy it at exit if nothing else does.

    Only gloo: destroying an NCCL group at exit waits for its pending work, which a job exiting on
    an error may never finish; torch handles NCCL's at-exit teardown itself.
    """
    world = dist.group.WORLD
    if world is not None and backend.split(":")[-1].endswith("gloo"):
        _made_group[:] = [weakref.ref(world)]


def destroy_group(group: Any = None) -> None:
    """``dist.destroy_process_group(group)``, keeping a gloo group's object alive until exit."""
    target = dist.group.WORLD if group is None else group
    keep = isinstance(target, dist.ProcessGroup) and "gloo" in str(dist.get_backend(target))
    dist.destroy_process_group(group)
    if keep:
        _retired.append(target)


def retired_group_count() -> int:
    """How many destroyed gloo groups are held until exit (for tests and diagnostics)."""
    return len(_retired)


def _destroy_made_group() -> None:
    """At interpreter exit: destroy the gloo group hasten made, if it is still the live one."""
    if not _made_group:
        return
    group = _made_group[0]()
    if group is None or not dist.is_initialized() or group is not dist.group.WORLD:
        return
    try:
        destroy_group()
    except Exception:  # noqa: BLE001 - exiting anyway; a torn group must not mask the exit code
        logger.debug("Destroying the process group at exit failed", exc_info=True)


def release_retired() -> None:
    """Let the retired groups' worker threads drain, then release the groups.

    Called before hasten makes a new group (the old one's rendezvous store and sockets go with
    it) and at interpreter exit, after `_destroy_made_group`.
    """
    if not _retired:
        return
    time.sleep(_DRAIN_S)  # the GIL is free meanwhile: a worker finishing a work can take it
    _retired.clear()


# atexit runs the last registered first: the group is destroyed, then the retired ones released.
atexit.register(release_retired)
atexit.register(_destroy_made_group)

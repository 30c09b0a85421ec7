"""`Accelerator.profile`: run a block under `torch.profiler`, one Chrome trace per process."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

__all__ = ["ProfilerFactory", "profile"]


class ProfilerFactory(Protocol):
    """What `profile` needs from `ProfileKwargs`."""

    def build(self) -> Any:
        """Return a configured (not yet entered) `torch.profiler.profile`."""
        ...

    def export_trace(self, profiler: Any, process_index: int = 0) -> Path | None:
        """Write the trace of ``profiler`` if an output directory is set; return the file."""
        ...


@contextlib.contextmanager
def profile(
    handler: ProfilerFactory, process_index: int, barrier: Callable[[], None]
) -> Iterator[Any]:
    """Profile the enclosed block, then export this process's trace if a directory is set.

    Args:
        handler: the `ProfileKwargs` describing activities, schedule and output directory.
        process_index: this process's index, used in the trace file name.
        barrier: called after writing so no process reads traces before all exist.

    Yields:
        The running `torch.profiler.profile`, for ``step()`` calls under a schedule.
    """
    with handler.build() as profiler:
        yield profiler
    if handler.export_trace(profiler, process_index) is not None:
        barrier()

"""DeepSpeed's checkpoint files written through hasten's writer during `save_state`.

A DeepSpeed engine serialises every checkpoint file through its pluggable checkpoint engine
(``engine.checkpoint_engine.save(state_dict, path)``). `HastenCheckpointEngine` wraps the
engine's own `TorchCheckpointEngine`: while hasten saves, each file goes to the `EngineFileSink`
hasten passes in (which hashes the bytes as they are written and fsyncs off the training thread,
or copies the state to host memory for an asynchronous save), so nothing is read back to be
checksummed. Outside `save_state` (a direct ``engine.save_checkpoint``) and for loading it is
the engine's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Protocol

import torch

__all__ = [
    "EngineFileSink",
    "HastenCheckpointEngine",
    "check_checkpoint_engine",
    "install_checkpoint_engine",
]


class EngineFileSink(Protocol):
    """Where hasten takes the engine's files during a save (``checkpointing.engine``)."""

    def write(self, path: str, obj: Any, serialize: Callable[[Any, BinaryIO], None]) -> None:
        """Store ``serialize(obj, handle)`` as the file ``path`` (inside the staging folder)."""
        ...


class HastenCheckpointEngine:
    """The engine's `TorchCheckpointEngine`, writing through hasten's sink while one is set.

    Every other method (``create``, ``commit``, ``load``, ``makedirs``, ...) is the wrapped
    engine's, so DeepSpeed's save and load logic is unchanged.

    Args:
        inner: the checkpoint engine `deepspeed.initialize` created.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sink: EngineFileSink | None = None
        self._zipfile = bool(getattr(inner, "zipfile_serialization", True))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def save(self, state_dict: Any, path: str) -> None:
        """Write one checkpoint file (through the sink during `save_state`)."""
        if self.sink is None:
            self.inner.save(state_dict, path)
            return
        self.sink.write(str(path), state_dict, self._serialize)

    def _serialize(self, obj: Any, handle: BinaryIO) -> None:
        # the same bytes DeepSpeed's TorchCheckpointEngine writes
        torch.save(obj, handle, _use_new_zipfile_serialization=self._zipfile)

    @contextlib.contextmanager
    def writing_to(self, sink: EngineFileSink | None) -> Iterator[None]:
        """Route the files of the enclosed ``save_checkpoint`` to ``sink``."""
        self.sink = sink
        try:
            yield
        finally:
            self.sink = None


def install_checkpoint_engine(engine: Any) -> None:
    """Wrap ``engine``'s checkpoint engine if it is DeepSpeed's default `torch.save` one.

    Other checkpoint engines (a configured fast writer, Nebula, DataStates) keep writing
    their own files; hasten then checksums those after the engine is done. A decoupled one is
    refused at save time (see `check_checkpoint_engine`).
    """
    # optional: deepspeed
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    current = engine.checkpoint_engine
    if type(current) is TorchCheckpointEngine:
        engine.checkpoint_engine = HastenCheckpointEngine(current)


def check_checkpoint_engine(engine: Any) -> None:
    """Refuse a checkpoint engine that writes after ``save_checkpoint`` returns.

    Raises:
        ValueError: the DeepSpeed config selects a decoupled (background) checkpoint writer.
    """
    current = engine.checkpoint_engine
    if not isinstance(current, HastenCheckpointEngine) and current.is_decoupled():
        raise ValueError(
            "The DeepSpeed config selects a decoupled checkpoint writer "
            "(checkpoint.writer.decoupled=true): its files are still being written when "
            "save_checkpoint returns, so hasten cannot checksum and publish them atomically. "
            "Remove checkpoint.writer.decoupled from the config and use "
            "save_state(async_save=True) for saves in the background."
        )

"""DeepSpeed's checkpoint files written and read through hasten during `save_state`/`load_state`.

A DeepSpeed engine serialises every checkpoint file through its pluggable checkpoint engine
(``engine.checkpoint_engine.save(state_dict, path)``) and reads them back through it
(``load(path, map_location)``). `HastenCheckpointEngine` wraps the engine's own
`TorchCheckpointEngine`: while hasten saves, each file goes to the `EngineFileSink` hasten passes
in (which hashes the bytes as they are written and fsyncs off the training thread, or copies the
state to host memory for an asynchronous save), so nothing is read back to be checksummed. While
hasten loads, each file comes from the `EngineFileSource` (its bytes already checked against the
manifest) and is parsed by the wrapped engine's own ``load``, so each file is read once and
DeepSpeed's loading (``torch.load`` with ``weights_only=False``: its files hold its config and
other objects) is unchanged. Outside `save_state`/`load_state` (a direct
``engine.save_checkpoint``/``load_checkpoint``) it is the engine's own.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Collection, Iterator
from typing import Any, BinaryIO

import torch

from hasten.strategies.checkpoints import EngineFileSink, EngineFileSource

__all__ = [
    "HastenCheckpointEngine",
    "check_checkpoint_engine",
    "file_readers",
    "install_checkpoint_engine",
]


class HastenCheckpointEngine:
    """The engine's `TorchCheckpointEngine`, writing to hasten's sink and reading from its
    source while they are set.

    Every other method (``create``, ``commit``, ``makedirs``, ...) is the wrapped engine's, and
    the files are parsed by its ``load``, so DeepSpeed's save and load logic is unchanged.

    Args:
        inner: the checkpoint engine `deepspeed.initialize` created.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sink: EngineFileSink | None = None
        self.source: EngineFileSource | None = None
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

    def load(self, path: str, map_location: Any = None) -> Any:
        """Read one checkpoint file (from the source during `load_state`)."""
        if self.source is None:
            return self.inner.load(path, map_location)
        # the engine's own load parses the verified bytes (a file object torch.load takes)
        return self.source.read(str(path), lambda handle: self.inner.load(handle, map_location))

    @contextlib.contextmanager
    def writing_to(self, sink: EngineFileSink | None) -> Iterator[None]:
        """Route the files of the enclosed ``save_checkpoint`` to ``sink``."""
        self.sink = sink
        try:
            yield
        finally:
            self.sink = None

    @contextlib.contextmanager
    def reading_from(self, source: EngineFileSource | None) -> Iterator[None]:
        """Take the files of the enclosed ``load_checkpoint`` from ``source``."""
        self.source = source
        try:
            yield
        finally:
            self.source = None


# The files of one ZeRO partition (``[bf16_]zero_pp_rank_<r>_mp_rank_<m>_{model,optim}_states.pt``,
# read by data-parallel rank r) and the replicated model file (``mp_rank_<m>_model_states.pt``,
# read by every process), as DeepSpeed names them.
_PARTITION = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_(?:model|optim)_states\.pt")
_REPLICATED = re.compile(r"mp_rank_\d+_model_states\.pt")


def file_readers(basename: str, num_processes: int) -> Collection[int]:
    """The processes whose engine reads the checkpoint file ``basename`` when each process is
    one data-parallel rank; empty for files DeepSpeed's name does not tell (experts, scripts).

    Only a prediction: a file read by another process is still verified when it is read.
    """
    partition = _PARTITION.fullmatch(basename)
    if partition is not None:
        rank = int(partition.group(1))
        return (rank,) if rank < num_processes else ()
    if _REPLICATED.fullmatch(basename) is not None:
        return range(num_processes)
    return ()


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

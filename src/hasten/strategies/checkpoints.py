"""What a strategy tells the checkpoint code: the layout it declares, and what each layout needs.

A strategy declares how `save_state` writes its models and optimizers by choosing one of the
layouts a `LayoutFactory` offers (`Strategy.checkpoint_layout`), handing itself over as what
that layout reads state through. The factory is implemented above, by
`hasten.checkpointing.layouts`, so strategies name a layout without importing the checkpoint
code, and the layout gets a typed strategy instead of probing it for attributes:

- `StateDicts`: the state-dict methods every strategy has (a replicated layout, and a sharded
  part found on disk, are read through them);
- `ShardedStateDicts`: those plus one pass over a model and its optimizer together (strategies
  whose parameters are split across processes);
- `EngineCheckpoint`: an engine that writes and reads its own checkpoint files (DeepSpeed),
  through the `EngineFileSink` / `EngineFileSource` hasten passes in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import torch
from torch import nn

__all__ = [
    "EngineCheckpoint",
    "EngineFileSink",
    "EngineFileSource",
    "LayoutFactory",
    "ShardedStateDicts",
    "StateDicts",
]

LayoutT_co = TypeVar("LayoutT_co", covariant=True)


class StateDicts(Protocol):
    """The state-dict methods of every strategy (`hasten.strategies.base.Strategy`)."""

    def unwrap(
        self, module: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """The user's model from the strategy's wrappers."""
        ...

    def model_state_dict(self, model: nn.Module, *, full: bool = True) -> dict[str, Any]:
        """The model's state dict: full (gathered) or this process's shards."""
        ...

    def load_model_state_dict(
        self,
        model: nn.Module,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
        strict: bool = True,
    ) -> None:
        """Load what `model_state_dict` returned."""
        ...

    def optimizer_state_dict(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool = True
    ) -> dict[str, Any]:
        """The optimizer's state dict: torch's format (full) or keyed by parameter name."""
        ...

    def load_optimizer_state_dict(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
    ) -> None:
        """Load what `optimizer_state_dict` returned."""
        ...


class ShardedStateDicts(StateDicts, Protocol):
    """A strategy whose parameters are split across processes (`ShardedStrategy`)."""

    def sharded_state_dicts(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """This process's shards of ``model`` and of its one ``optimizer``, in one pass."""
        ...

    def load_sharded_state_dicts(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        model_state: dict[str, Any],
        optimizer_state: dict[str, Any],
    ) -> None:
        """Load what `sharded_state_dicts` returned."""
        ...


class EngineFileSink(Protocol):
    """Where hasten takes an engine's files during a save (``EngineFiles``)."""

    def write(self, path: str, obj: Any, serialize: Callable[[Any, BinaryIO], None]) -> None:
        """Store ``serialize(obj, handle)`` as the file ``path`` (inside the staging folder)."""
        ...


class EngineFileSource(Protocol):
    """Where hasten gives an engine its files during a load (``EngineReads``)."""

    def read(self, path: str, load: Callable[[BinaryIO], Any]) -> Any:
        """``load(file)`` of the file ``path``, over its bytes verified against the manifest."""
        ...


class EngineCheckpoint(Protocol):
    """A strategy whose engine writes and reads its own checkpoint (`DeepSpeedStrategy`)."""

    def save_checkpoint(self, folder: Path, files: EngineFileSink | None = None) -> None:
        """Write the engine state into ``folder`` (every process together), via ``files``."""
        ...

    def load_checkpoint(
        self, folder: Path, strict: bool = True, files: EngineFileSource | None = None
    ) -> None:
        """Restore the engine state from ``folder`` (every process together), via ``files``."""
        ...

    def file_readers(self, name: str, num_processes: int) -> Collection[int]:
        """The processes whose engine reads the file ``name`` through ``files`` (none: unknown)."""
        ...

    def refuses_process_count(self, saved: int, processes: int) -> str | None:
        """Why the engine cannot load a checkpoint ``saved`` processes wrote on ``processes``
        (None: it can)."""
        ...


class LayoutFactory(Protocol[LayoutT_co]):
    """The ways of saving models and optimizers a strategy can declare.

    `hasten.checkpointing.layouts` implements it; a strategy picks one in
    `Strategy.checkpoint_layout`, passing itself as what the layout reads state through.
    """

    def replicated(self, strategy: StateDicts) -> LayoutT_co:
        """One copy of every model and optimizer, written by the main process; loaded in place."""
        ...

    def gathered(self, strategy: ShardedStateDicts) -> LayoutT_co:
        """Parameters split across processes, gathered to the main process and written as one
        copy (a FULL_STATE_DICT); loaded through the strategy, which shards them again."""
        ...

    def sharded(self, strategy: ShardedStateDicts) -> LayoutT_co:
        """Every process writes its shards through torch.distributed.checkpoint."""
        ...

    def engine(self, strategy: EngineCheckpoint) -> LayoutT_co:
        """The engine writes and reads models, optimizers and schedulers itself."""
        ...

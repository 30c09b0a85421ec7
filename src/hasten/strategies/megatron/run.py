"""What Megatron-LM's helpers read of the run, typed: a `RunView`.

``initialize``, ``prepare_model_optimizer_scheduler``, ``MegatronEngine``, the train steps and
``prepare_data_loader`` are Accelerate's API and take the Accelerator; `MegatronStrategy` hands
them a `MegatronRun` instead, the view of its `PrepareCall` and the shared state with the same
attribute names, so no strategy holds the Accelerator.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import torch

from hasten.state import AcceleratorState
from hasten.strategies.call import PrepareCall

if TYPE_CHECKING:
    from hasten.config.megatron import MegatronLMPlugin

__all__ = ["MegatronRun", "RunView", "megatron_plugin"]


class RunView(Protocol):
    """The attributes Megatron-LM's helpers read (the Accelerator has them all)."""

    @property
    def state(self) -> AcceleratorState:
        """The shared state (its ``megatron_lm_plugin``)."""
        ...

    @property
    def device(self) -> torch.device:
        """This process's device."""
        ...

    @property
    def num_processes(self) -> int:
        """Processes in the run."""
        ...

    @property
    def process_index(self) -> int:
        """This process's index."""
        ...

    @property
    def mixed_precision(self) -> str:
        """The run's mixed precision label."""
        ...

    @property
    def rng_types(self) -> list[str]:
        """The RNGs data loaders synchronise."""
        ...

    @property
    def split_batches(self) -> bool:
        """Whether loaders split the global batch."""
        ...

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether the main process reads and dispatches batches."""
        ...


@dataclasses.dataclass(frozen=True)
class MegatronRun:
    """What Megatron-LM's helpers read of the run (``initialize``, ``MegatronEngine``,
    ``prepare_data_loader``, ...): Accelerate hands them the Accelerator; the strategy hands
    them this view of its `PrepareCall` and the shared state, with the same attribute names.
    """

    device: torch.device
    rng_types: list[str]
    split_batches: bool
    dispatch_batches: bool | None

    @classmethod
    def of(cls, call: PrepareCall) -> MegatronRun:
        """The run as ``call`` describes it."""
        data = call.data
        return cls(
            device=call.device,
            rng_types=list(call.rng_types),
            split_batches=bool(data.split_batches) if data is not None else False,
            dispatch_batches=data.dispatch_batches if data is not None else None,
        )

    @property
    def state(self) -> AcceleratorState:
        """The shared `AcceleratorState` (its ``megatron_lm_plugin``)."""
        return AcceleratorState()

    @property
    def num_processes(self) -> int:
        """Processes in the run."""
        return int(self.state.num_processes)

    @property
    def process_index(self) -> int:
        """This process's index."""
        return int(self.state.process_index)

    @property
    def mixed_precision(self) -> str:
        """The run's mixed precision ("no", "fp16", "bf16" or "fp8")."""
        return str(self.state.mixed_precision)


def megatron_plugin(run: RunView) -> MegatronLMPlugin:
    """The run's `MegatronLMPlugin`.

    Raises:
        RuntimeError: the run has none (Megatron-LM's helpers need a Megatron-LM run).
    """
    plugin = run.state.megatron_lm_plugin
    if plugin is None:
        raise RuntimeError(
            "Megatron-LM's helpers need a Megatron-LM run, and this one has no MegatronLMPlugin: "
            "pass Accelerator(megatron_lm_plugin=MegatronLMPlugin(...)) or launch with "
            "--use_megatron_lm."
        )
    return plugin

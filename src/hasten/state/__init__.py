"""Where this process stands in the job: `PartialState`, `AcceleratorState`, `GradientState`.

Same import path as ``accelerate.state``. Every class here shares its attributes between all
of its instances; `hasten.state._shared.reset_state()` forgets them (for tests).
"""

from hasten.config.enums import DistributedType
from hasten.state._shared import SharedDict, ThreadLocalSharedDict, do_nothing
from hasten.state.accelerator_state import AcceleratorState
from hasten.state.gradient import GradientState
from hasten.state.partial import PartialState

__all__ = [
    "AcceleratorState",
    "DistributedType",
    "GradientState",
    "PartialState",
    "SharedDict",
    "ThreadLocalSharedDict",
    "do_nothing",
    "is_initialized",
    "wait_for_everyone",
]


def is_initialized() -> bool:
    """Return whether an `Accelerator` has set up the `AcceleratorState` in this process."""
    return bool(AcceleratorState._shared_state)


def wait_for_everyone() -> None:
    """Block until every process reaches this point (no-op for a single process)."""
    PartialState().wait_for_everyone()

"""Training on inputs whose length differs between processes (`Accelerator.join_uneven_inputs`).

Under DDP, processes that run out of batches keep answering the others' all-reduces (torch's
``Join``, through the strategy); other strategies have nothing to join, and say so once.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from hasten.strategies.base import Strategy

__all__ = ["uneven_inputs"]

_NO_JOIN = (
    "Joining uneven inputs is only supported for multi-GPU training, as a result "
    "`join_uneven_inputs` will have no effect. (hasten: only DDP shadows the collectives of "
    "finished processes; this run uses {}.)"
)


@contextlib.contextmanager
def uneven_inputs(
    strategy: Strategy,
    num_processes: int,
    dataloaders: list[Any],
    joinables: list[Any],
    even_batches: bool | None = None,
) -> Iterator[Any]:
    """The strategy's join over ``joinables``, with ``even_batches`` of the prepared map-style
    ``dataloaders`` overridden inside (None: unchanged); warns when nothing can be joined."""
    from hasten.data_loader.samplers import override_even_batches

    several = num_processes > 1
    if several and not strategy.joins_uneven_inputs:
        warnings.warn(_NO_JOIN.format(strategy.name), UserWarning, stacklevel=3)
    with (
        override_even_batches(dataloaders, even_batches, several=several),
        strategy.join(joinables) as context,
    ):
        yield context

"""`gather_for_metrics`: gather evaluation outputs and drop the samples padding added.

With ``even_batches`` the last batch of every process is topped up with samples from the start
of the dataset so collectives line up; the data loader records how many gathered samples of
that final batch are real (`GradientState.remainder`) and they are the only ones kept, so the
result equals a single-process evaluation exactly.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hasten.core.nested import recursively_apply
from hasten.ops.collectives import gather, gather_object

__all__ = ["MetricsGradientState", "gather_for_metrics", "is_all_tensors"]


class MetricsGradientState(Protocol):
    """What `gather_for_metrics` reads from `GradientState`."""

    @property
    def end_of_dataloader(self) -> bool: ...

    @property
    def remainder(self) -> int: ...


def is_all_tensors(data: Any) -> bool:
    """Tell whether every leaf of the nested structure ``data`` is a tensor."""
    if isinstance(data, torch.Tensor):
        return True
    try:
        recursively_apply(lambda t: t, data, error_on_other_type=True)
    except TypeError:
        return False
    return True


def _truncate(data: Any, keep: int, as_objects: bool) -> Any:
    if as_objects:
        return data[:keep]
    return recursively_apply(lambda t: t[:keep], data)


def gather_for_metrics(
    input_data: Any,
    use_gather_object: bool = False,
    *,
    gradient_state: MetricsGradientState,
    num_processes: int,
) -> Any:
    """Gather ``input_data`` from all processes, dropping the duplicates of the last batch.

    Args:
        input_data: tensors (any nesting) or, with ``use_gather_object``, picklable objects.
        use_gather_object: gather Python objects instead of tensors (automatic for non-tensors).
        gradient_state: the shared state that knows the end of the data and the remainder.
        num_processes: how many processes take part.

    Returns:
        The gathered data, in dataset order, without padding samples.
    """
    as_objects = use_gather_object or not is_all_tensors(input_data)
    data = gather_object(input_data) if as_objects else gather(input_data)
    if num_processes == 1 or not gradient_state.end_of_dataloader:
        return data
    remainder = gradient_state.remainder
    # -1: the dataset has no length, so nothing is known about padding; 0: nothing was padded.
    if remainder <= 0:
        return data
    return _truncate(data, remainder, as_objects)

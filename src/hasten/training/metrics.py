"""`gather_for_metrics`: gather evaluation outputs and drop the samples padding added.

With ``even_batches`` the last batch of every process is topped up with samples from the start
of the dataset so collectives line up; the data loader records how many gathered samples of
that final batch are real (`GradientState.remainder`) and they are the only ones kept, so the
result equals a single-process evaluation exactly.

As in Accelerate this also happens on one process: a value repeated to the batch size (the
``loss.repeat(batch_size)`` idiom of perplexity scripts) keeps only the real samples of the
last batch. Leaves that cannot be cut (0-d tensors, non-sequence objects) leave the whole
result as gathered, which is Accelerate's behaviour too.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch

from hasten.core.nested import recursively_apply
from hasten.ops.collectives import gather_object_on, gather_on
from hasten.ops.comm import Communicator, current_comm

__all__ = ["MetricsGradientState", "gather_for_metrics", "is_all_tensors"]

logger = logging.getLogger(__name__)


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
    try:
        if as_objects:
            return data[:keep]
        return recursively_apply(lambda t: t[:keep], data)
    except (TypeError, IndexError, KeyError):
        # A 0-d tensor or an object without slicing: nothing is dropped (as in Accelerate).
        return data


def gather_for_metrics(
    input_data: Any,
    use_gather_object: bool = False,
    *,
    gradient_state: MetricsGradientState,
    comm: Communicator | None = None,
) -> Any:
    """Gather ``input_data`` from all processes, dropping the duplicates of the last batch.

    Args:
        input_data: tensors (any nesting) or, with ``use_gather_object``, picklable objects.
        use_gather_object: gather Python objects instead of tensors (automatic for non-tensors).
        gradient_state: the shared state that knows the end of the data and the remainder.
        comm: gather over these processes only (the data-parallel replicas when tensor- or
            context-parallel groups hold the same samples); default: every process.

    Returns:
        The gathered data, in dataset order; on the last batch only its ``remainder`` real
        samples (on any number of processes, as in Accelerate).
    """
    as_objects = use_gather_object or not is_all_tensors(input_data)
    comm = current_comm() if comm is None else comm
    data = gather_object_on(comm, input_data) if as_objects else gather_on(comm, input_data)
    if not gradient_state.end_of_dataloader:
        return data
    remainder = gradient_state.remainder
    if remainder == -1:
        logger.info(
            "gather_for_metrics: the dataset has no length (or drop_last is set), so the "
            "gathered values are returned whole; drop any padding samples yourself."
        )
        return data
    if remainder == 0:  # the last batch was full: nothing was padded
        return data
    return _truncate(data, remainder, as_objects)

"""Split inputs between processes: contiguous shares that differ by at most one element.

Used by `PartialState.split_between_processes` (e.g. distributed inference over prompts).
Pure: the process index and count come in as arguments, so every case is testable alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hasten.core.nested import rebuild_mapping

__all__ = ["share_bounds", "split_inputs"]


def share_bounds(length: int, process_index: int, num_processes: int) -> tuple[int, int, int]:
    """Return (start, end, padded_length) of this process's share of `length` items.

    The first ``length % num_processes`` processes take one extra item; `padded_length` is the
    length of the longest share.
    """
    per_process, extras = divmod(length, num_processes)
    start = process_index * per_process + min(process_index, extras)
    end = start + per_process + (1 if process_index < extras else 0)
    return start, end, per_process + (1 if extras else 0)


def _length(inputs: Any) -> int:
    if isinstance(inputs, Mapping):
        lengths = {key: _length(value) for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                "split_between_processes needs every value of the dict to have the same length; "
                f"got lengths {lengths}. Pad or trim the values to one length first."
            )
        return next(iter(lengths.values()), 0)
    try:
        return len(inputs)
    except TypeError:
        raise TypeError(
            f"split_between_processes cannot split a {type(inputs).__name__}; pass a list, "
            "tuple, tensor, numpy array, dict of those, or a datasets.Dataset."
        ) from None


def _take(inputs: Any, start: int, end: int, target: int, pad: bool) -> Any:
    missing = target - (end - start) if pad and len(inputs) else 0
    if isinstance(inputs, Mapping):
        split = {key: _take(value, start, end, target, pad) for key, value in inputs.items()}
        return rebuild_mapping(inputs, split)
    if isinstance(inputs, torch.Tensor):
        tensor_share = inputs[start:end]
        if missing:
            filler = inputs[-1:].expand(missing, *inputs.shape[1:])
            tensor_share = torch.cat([tensor_share, filler])
        return tensor_share
    if isinstance(inputs, np.ndarray):
        array_share = inputs[start:end]
        if missing:
            array_share = np.concatenate([array_share, np.repeat(inputs[-1:], missing, axis=0)])
        return array_share
    if isinstance(inputs, (list, tuple)):
        share = list(inputs[start:end])
        if missing:
            share += [inputs[-1]] * missing
        # Like slicing: list and tuple subclasses (namedtuples included) come back as plain ones.
        return share if isinstance(inputs, list) else tuple(share)
    if hasattr(inputs, "select"):
        # datasets.Dataset (optional: datasets): select rows by index, padding with the last row.
        stop = min(end, len(inputs))
        rows = list(range(min(start, stop), stop)) + [len(inputs) - 1] * max(missing, 0)
        return inputs.select(rows)
    if isinstance(inputs, Sequence):
        return inputs[start:end]
    raise TypeError(
        f"split_between_processes cannot split a {type(inputs).__name__}; pass a list, tuple, "
        "tensor, numpy array, dict of those, or a datasets.Dataset."
    )


def split_inputs(
    inputs: Any, process_index: int, num_processes: int, apply_padding: bool = False
) -> Any:
    """Return process `process_index`'s contiguous share of `inputs`, keeping its type.

    Args:
        inputs: list, tuple, tensor, numpy array, dict of those (all the same length), or
            anything with ``select`` (a datasets.Dataset).
        process_index: this process's index.
        num_processes: how many processes share the inputs.
        apply_padding: pad short shares by repeating the last element of `inputs`.

    Raises:
        ValueError: dict values of different lengths.
        TypeError: `inputs` is of a type that cannot be split.
    """
    start, end, target = share_bounds(_length(inputs), process_index, num_processes)
    return _take(inputs, start, end, target, apply_padding)

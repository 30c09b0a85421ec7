"""Nested structures of tensors: walk, rebuild with the same types, move, slice and measure them.

Everything here runs once per batch (send_to_device, find_batch_size, convert_to_fp32), so the
common shapes -- a bare tensor, a flat dict of tensors -- take a short path before the general
recursion. No collectives live here; `hasten.ops` builds them on top of these helpers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import update_wrapper
from typing import Any

import torch

__all__ = [
    "ConvertOutputsToFp32",
    "TensorInformation",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "find_batch_size",
    "find_device",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "is_torch_xpu_tensor",
    "listify",
    "merge_dicts",
    "rebuild_mapping",
    "recursively_apply",
    "send_to_device",
    "slice_tensors",
]

_Tensor = torch.Tensor
_HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor, enough to allocate a receiving buffer for it."""

    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(tensor: Any) -> bool:
    """Return True when ``tensor`` is a `torch.Tensor` (the default leaf test)."""
    return isinstance(tensor, _Tensor)


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """Return whether `tensor` is a tensor on an Intel XPU."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def is_tensor_information(tensor_info: Any) -> bool:
    """Return True when ``tensor_info`` is a `TensorInformation` placeholder."""
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data: Any) -> bool:
    """Return True when ``data`` looks like a namedtuple (a tuple with ``_fields``/``_asdict``)."""
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(data, "_asdict")


def honor_type(obj: Any, generator: Any) -> Any:
    """Build a container of ``obj``'s type (list, tuple, namedtuple, ...) from ``generator``."""
    if is_namedtuple(obj):
        # namedtuples take their fields positionally, not as one iterable
        return type(obj)(*list(generator))
    return type(obj)(generator)


def rebuild_mapping(template: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """Return ``items`` as a mapping of ``template``'s type (dict, OrderedDict, BatchEncoding, ...)."""
    cls: Any = type(template)
    if cls is dict:
        return items
    if isinstance(template, defaultdict):
        return cls(template.default_factory, items)
    try:
        return cls(items)
    except TypeError:
        # A Mapping whose constructor does not accept a dict: a plain dict keeps the data usable.
        return items


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply ``func`` to every leaf of ``data`` accepted by ``test_type``, keeping container types.

    Args:
        func: called as ``func(leaf, *args, **kwargs)`` on each accepted leaf.
        data: a leaf or a nested list/tuple/namedtuple/dict/Mapping of leaves.
        *args: extra positional arguments for ``func``.
        test_type: predicate deciding which leaves ``func`` applies to.
        error_on_other_type: raise a TypeError on a leaf that ``test_type`` rejects instead of
            returning it unchanged.
        **kwargs: extra keyword arguments for ``func``.

    Returns:
        The same structure as ``data`` with ``func`` applied to the accepted leaves.
    """
    if test_type is is_torch_tensor and type(data) is _Tensor:
        return func(data, *args, **kwargs)
    return _apply(data, func, args, kwargs, test_type, error_on_other_type)


def _apply(
    obj: Any,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    test_type: Callable[[Any], bool],
    error_on_other_type: bool,
) -> Any:
    """The walk of `recursively_apply` (module level: no closure built per call)."""
    if isinstance(obj, (list, tuple)):
        done = [_apply(o, func, args, kwargs, test_type, error_on_other_type) for o in obj]
        return done if type(obj) is list else honor_type(obj, done)
    if isinstance(obj, Mapping):
        return rebuild_mapping(
            obj,
            {
                k: _apply(v, func, args, kwargs, test_type, error_on_other_type)
                for k, v in obj.items()
            },
        )
    if test_type(obj):
        return func(obj, *args, **kwargs)
    if error_on_other_type:
        name = getattr(func, "__name__", repr(func))
        test = getattr(test_type, "__name__", repr(test_type))
        # Accelerate's sentence, whole: its test_honor_type compares the message with ==.
        raise TypeError(
            f"Unsupported types ({type(obj)}) passed to `{name}`. Only nested list/tuple/dicts "
            f"of objects that are valid for `{test}` should be passed."
        )
    return obj


def _move(obj: Any, device: Any, non_blocking: bool) -> Any:
    try:
        return obj.to(device, non_blocking=non_blocking)
    except TypeError:
        # some objects' `.to()` (e.g. user classes) take no `non_blocking` keyword
        return obj.to(device)


_NO_SKIP: frozenset[Any] = frozenset()


def _send(obj: Any, device: Any, non_blocking: bool, skip: frozenset[Any]) -> Any:
    """The general walk of `send_to_device` (module level: no closure built per call)."""
    if isinstance(obj, _Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        moved = [_send(o, device, non_blocking, skip) for o in obj]
        return moved if type(obj) is list else honor_type(obj, moved)
    if isinstance(obj, Mapping) and (skip or not hasattr(obj, "to")):
        return rebuild_mapping(
            obj,
            {k: v if k in skip else _send(v, device, non_blocking, skip) for k, v in obj.items()},
        )
    if hasattr(obj, "to"):
        return _move(obj, device, non_blocking)
    return obj


def send_to_device(
    tensor: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: str | Sequence[str] | None = None,
) -> Any:
    """Move every tensor (or object with ``.to()``) in a nested structure to ``device``.

    Args:
        tensor: a tensor, an object with a ``.to()`` method, or a nested structure of them.
        device: the target device.
        non_blocking: ask for an asynchronous copy where the device supports it (CUDA).
        skip_keys: a key or keys of the dicts in ``tensor`` whose values stay where they are.

    Returns:
        The same structure with its tensors on ``device``.
    """
    if device == "npu":
        # torch_npu cannot find its context on the first bare "npu" transfer
        device = "npu:0"
    if (
        non_blocking.__class__ is not bool
    ):  # Accelerate takes any flag (1, None); torch wants a bool
        non_blocking = bool(non_blocking)
    if type(tensor) is _Tensor:
        return tensor.to(device, non_blocking=non_blocking)
    if skip_keys is None:
        if type(tensor) is dict:
            # the usual batch: a plain dict, mostly of tensors
            return {
                k: v.to(device, non_blocking=non_blocking)
                if type(v) is _Tensor
                else _send(v, device, non_blocking, _NO_SKIP)
                for k, v in tensor.items()
            }
        return _send(tensor, device, non_blocking, _NO_SKIP)
    skip = frozenset([skip_keys] if isinstance(skip_keys, str) else skip_keys)
    return _send(tensor, device, non_blocking, skip)


def get_data_structure(data: Any) -> Any:
    """Replace every tensor in ``data`` by its `TensorInformation` (to rebuild it elsewhere)."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data: Any) -> Any:
    """Replace every tensor in ``data`` by its shape as a list of ints."""
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Allocate an empty tensor for every `TensorInformation` in ``data_structure``."""
    return recursively_apply(
        lambda info: torch.empty(*info.shape, dtype=info.dtype),
        data_structure,
        test_type=is_tensor_information,
    )


def find_batch_size(data: Any) -> int:
    """Return the size of the first dimension of the first tensor found in ``data``.

    Raises:
        ValueError: ``data`` (or the first nested container) is empty.
        TypeError: the first leaf found is not a tensor.
    """
    while True:
        if type(data) is _Tensor or isinstance(data, _Tensor):
            return int(data.shape[0])
        if isinstance(data, (list, tuple, Mapping)):
            if len(data) == 0:
                raise ValueError(
                    f"Cannot find the batch size of an empty {type(data).__name__} ({data!r}): "
                    "pass a structure holding at least one tensor."
                )
            data = next(iter(data.values())) if isinstance(data, Mapping) else data[0]
            continue
        raise TypeError(
            f"Can only find the batch size of tensors, got {type(data).__name__} ({data!r}). "
            "Put the batch's tensors first in the structure."
        )


def ignorant_find_batch_size(data: Any) -> int | None:
    """Like `find_batch_size` but return None instead of raising on empty or non-tensor data."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def find_device(data: Any) -> torch.device | None:
    """Return the device of the first tensor in ``data`` (None when it holds no tensor)."""
    if isinstance(data, _Tensor):
        return data.device
    if isinstance(data, Mapping):
        data = data.values()
    elif not isinstance(data, (list, tuple)):
        return None
    for obj in data:
        device = find_device(obj)
        if device is not None:
            return device
    return None


def _to_list(tensor: torch.Tensor) -> Any:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        # numpy (which .tolist() goes through for some dtypes) has no bfloat16
        tensor = tensor.float()
    return tensor.tolist()


def listify(data: Any) -> Any:
    """Replace every tensor in ``data`` by Python numbers (nested lists for non-scalars)."""
    return recursively_apply(_to_list, data)


def _slice(tensor: torch.Tensor, tensor_slice: Any) -> torch.Tensor:
    return tensor[tensor_slice]


def slice_tensors(
    data: Any,
    tensor_slice: slice | Any,
    process_index: int | None = None,
    num_processes: int | None = None,
) -> Any:
    """Index every tensor in ``data`` with ``tensor_slice``, keeping the structure.

    ``process_index`` and ``num_processes`` are accepted for API compatibility and unused.
    """
    return recursively_apply(_slice, data, tensor_slice)


def concatenate(data: Sequence[Any], dim: int = 0) -> Any:
    """Concatenate a list of same-structured batches into one batch along ``dim``.

    Raises:
        TypeError: the batches hold something other than tensors and containers.
    """
    first = data[0]
    if isinstance(first, _Tensor):
        return torch.cat(list(data), dim=dim)
    if isinstance(first, (list, tuple)):
        return honor_type(
            first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first)))
        )
    if isinstance(first, Mapping):
        return rebuild_mapping(
            first, {k: concatenate([d[k] for d in data], dim=dim) for k in first}
        )
    if isinstance(data, (list, tuple)) and len(data) == 1:
        return first
    raise TypeError(
        f"Can only concatenate tensors (in nested list/tuple/dict structures), got "
        f"{type(first).__name__} ({first!r}). Convert the values to tensors first."
    )


def _is_half_tensor(obj: Any) -> bool:
    return getattr(obj, "dtype", None) in _HALF_DTYPES and hasattr(obj, "float")


def _to_fp32(tensor: Any) -> Any:
    return tensor.float()


def convert_to_fp32(tensor: Any) -> Any:
    """Return ``tensor`` with every fp16/bf16 tensor inside it converted to fp32."""
    if type(tensor) is _Tensor:
        return tensor.float() if tensor.dtype in _HALF_DTYPES else tensor
    return recursively_apply(_to_fp32, tensor, test_type=_is_half_tensor)


class ConvertOutputsToFp32:
    """Wrap a forward function so that its fp16/bf16 outputs come back in fp32.

    A class rather than a closure so that a model holding it can still be pickled;
    ``__wrapped__`` points to the original forward so unwrapping can restore it.
    """

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped forward and convert its half-precision outputs to fp32."""
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> dict[str, Any]:
        return {"model_forward": self.model_forward}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.model_forward = state["model_forward"]
        update_wrapper(self, self.model_forward)


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> ConvertOutputsToFp32:
    """Return a picklable wrapper of ``model_forward`` whose outputs are converted to fp32."""
    return ConvertOutputsToFp32(model_forward)


def merge_dicts(source: dict[Any, Any], destination: dict[Any, Any]) -> dict[Any, Any]:
    """Merge `source` into `destination` in place, recursing into nested dicts; return `destination`.

    A dict value of `source` is merged into the dict at the same key (created when missing);
    any other value replaces what `destination` had.
    """
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination

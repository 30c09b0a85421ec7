"""Compatibility path for ``accelerate.utils.operations``.

Nested-structure helpers live in `hasten.core.nested`; collectives in `hasten.ops.collectives`.
"""

from hasten.core.nested import (
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    honor_type,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from hasten.ops.collectives import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    pad_input_tensors,
    reduce,
)

__all__ = [
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "honor_type",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
]

"""Compatibility path for ``accelerate.utils.operations``.

Nested-structure helpers live in `hasten.core.nested`; collectives in `hasten.ops.collectives`.
"""

from hasten.core.nested import (
    ConvertOutputsToFp32,
    TensorInformation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    get_data_structure,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from hasten.ops.collectives import (
    CannotPadNestedTensorWarning,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    pad_input_tensors,
    reduce,
)
from hasten.ops.debug import DistributedOperationException, verify_operation

__all__ = [
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "TensorInformation",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "get_data_structure",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
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
    "verify_operation",
]

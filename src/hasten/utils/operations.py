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
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    is_torch_xpu_tensor,
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
from hasten.ops.debug import (
    DistributedOperationException,
    chained_operation,
    verify_operation,
)
from hasten.ops.shapes import (
    TENSOR_INT_TO_DTYPE,
    TENSOR_TYPE_TO_INT,
    gather_tensor_shape,
)
from hasten.strategies.deepspeed.zero import GatheredParameters

__all__ = [
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "GatheredParameters",
    "TENSOR_INT_TO_DTYPE",
    "TENSOR_TYPE_TO_INT",
    "TensorInformation",
    "broadcast",
    "broadcast_object_list",
    "chained_operation",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "gather_tensor_shape",
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
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
    "verify_operation",
]

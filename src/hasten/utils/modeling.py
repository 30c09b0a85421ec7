"""Compatibility path for ``accelerate.utils.modeling``. The code lives in `hasten.big_modeling`."""

from hasten.big_modeling.device_map import (
    check_device_map,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
)
from hasten.big_modeling.loading import (
    load_checkpoint_in_model,
    load_state_dict,
)
from hasten.big_modeling.offload import (
    load_offloaded_weights,
)
from hasten.big_modeling.sizes import (
    calculate_maximum_sizes,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    get_max_layer_size,
)
from hasten.big_modeling.tensors import (
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    get_module_children_bottom_up,
    get_non_persistent_buffers,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from hasten.core.constants import (
    WEIGHTS_INDEX_NAME,
)
from hasten.precision.amp import (
    get_grad_scaler,
    get_mixed_precision_context_manager,
)

__all__ = [
    "WEIGHTS_INDEX_NAME",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_tied_parameters_on_same_device",
    "compute_module_sizes",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_children_bottom_up",
    "get_non_persistent_buffers",
    "infer_auto_device_map",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

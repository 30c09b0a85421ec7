"""Compatibility path for ``accelerate.utils.modeling``. The code lives in `hasten.big_modeling`."""

from hasten.big_modeling.allocation import (
    clean_device_map,
    fallback_allocate,
    get_module_leaves,
    get_module_size_with_ties,
)
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
from hasten.big_modeling.onload import (
    align_module_device,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
)
from hasten.big_modeling.sizes import (
    calculate_maximum_sizes,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    get_max_layer_size,
)
from hasten.big_modeling.tensors import (
    check_device_same,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    get_module_children_bottom_up,
    get_non_persistent_buffers,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from hasten.checkpointing.storage.tensors import id_tensor_storage
from hasten.core.constants import (
    WEIGHTS_INDEX_NAME,
)
from hasten.precision.amp import (
    get_grad_scaler,
    get_mixed_precision_context_manager,
)
from hasten.strategies.unwrap import (
    is_peft_model,
)

__all__ = [
    "WEIGHTS_INDEX_NAME",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_children_bottom_up",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

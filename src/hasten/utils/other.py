"""Compatibility path for ``accelerate.utils.other``.

Unwrapping lives in `hasten.strategies.unwrap`, file I/O in `hasten.checkpointing.storage.io`,
`wait_for_everyone` in `hasten.state`, and `write_basic_config` in `hasten.commands.config.default`.
"""

from hasten.big_modeling.tensors import (
    get_module_children_bottom_up,
)
from hasten.checkpointing.storage.io import (
    TORCH_SAFE_GLOBALS,
    load,
    save,
)
from hasten.checkpointing.storage.tensors import (
    clean_state_dict_for_safetensors,
)
from hasten.commands.config.default import (
    write_basic_config,
)
from hasten.core.names import (
    get_pretty_name,
    recursive_getattr,
)
from hasten.core.nested import (
    merge_dicts,
)
from hasten.core.network import (
    get_free_port,
    is_port_in_use,
)
from hasten.core.units import (
    convert_bytes,
)
from hasten.platforms.info import (
    check_os_kernel,
)
from hasten.state import (
    wait_for_everyone,
)
from hasten.strategies.compile import (
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    has_compiled_regions,
    has_repeated_blocks,
    is_repeated_blocks,
)
from hasten.strategies.tensor_parallel import (
    get_model_tp_size,
    model_has_dtensor,
)
from hasten.strategies.unwrap import (
    extract_model_from_parallel,
    is_compiled_module,
)

__all__ = [
    "TORCH_SAFE_GLOBALS",
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_free_port",
    "get_model_tp_size",
    "get_module_children_bottom_up",
    "get_pretty_name",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_compiled_module",
    "is_port_in_use",
    "is_repeated_blocks",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
    "write_basic_config",
]

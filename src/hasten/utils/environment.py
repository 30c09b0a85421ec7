"""Compatibility path for ``accelerate.utils.environment``.

Environment helpers live in `hasten.core.environment`; NUMA affinity in `hasten.platforms.numa`.
"""

from hasten.core.environment import (
    CPUInformation,
    are_libraries_initialized,
    clear_environment,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)
from hasten.platforms.checks import (
    check_cuda_fp8_capability,
)
from hasten.platforms.info import (
    check_cuda_p2p_ib_support,
    get_current_device_type,
    get_driver_version,
    get_gpu_info,
)
from hasten.platforms.numa import (
    override_numa_affinity,
    set_numa_affinity,
)

__all__ = [
    "CPUInformation",
    "are_libraries_initialized",
    "check_cuda_fp8_capability",
    "check_cuda_p2p_ib_support",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "get_current_device_type",
    "get_driver_version",
    "get_gpu_info",
    "get_int_from_env",
    "override_numa_affinity",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "set_numa_affinity",
    "str_to_bool",
]

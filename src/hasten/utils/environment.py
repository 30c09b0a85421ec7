"""Compatibility path for ``accelerate.utils.environment``.

Environment helpers live in `hasten.core.environment`; NUMA affinity in `hasten.platforms.numa`.
"""

from hasten.core.environment import (
    clear_environment,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)
from hasten.platforms.numa import override_numa_affinity, set_numa_affinity

__all__ = [
    "clear_environment",
    "override_numa_affinity",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "set_numa_affinity",
    "str_to_bool",
]

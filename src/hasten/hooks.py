"""Compatibility path for ``accelerate.hooks``. The code lives in `hasten.big_modeling.hooks` and `.casting`."""

from hasten.big_modeling.casting import LayerwiseCastingHook
from hasten.big_modeling.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]

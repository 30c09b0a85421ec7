"""Run models larger than memory: empty-weight init, device maps, dispatch, offload, loading.

The entry points users know from Accelerate live here; sizing and planning are in
`hasten.big_modeling.sizes` / `device_map`, hooks in `hooks`, layerwise casting in `casting`, loading in `loading`/`offload`,
8/4-bit quantization in `quantization`.
"""

from hasten.big_modeling.casting import attach_layerwise_casting_hooks
from hasten.big_modeling.dispatch import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from hasten.big_modeling.init import init_empty_weights, init_on_device

__all__ = [
    "attach_layerwise_casting_hooks",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
]

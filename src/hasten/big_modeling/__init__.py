"""Run models larger than memory: empty-weight init, device maps, dispatch, offload, loading.

The entry points users know from Accelerate live here; sizing and planning are in
`hasten.big_modeling.sizes` / `device_map`, hooks in `hooks`, layerwise casting in `casting`, loading in `loading`/`offload`,
8/4-bit quantization in `quantization`.

Accelerate's ``big_modeling`` module also holds the helpers its functions call (imported names,
re-exported here with ``as``): hasten's dispatch functions look them up on this package when
called, so code that replaces one here (transformers swaps ``check_device_map``) changes what
they call, as with Accelerate.
"""

from hasten.big_modeling.casting import attach_layerwise_casting_hooks
from hasten.big_modeling.device_map import check_device_map as check_device_map
from hasten.big_modeling.device_map import get_balanced_memory as get_balanced_memory
from hasten.big_modeling.device_map import infer_auto_device_map as infer_auto_device_map
from hasten.big_modeling.dispatch import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from hasten.big_modeling.hooks import AlignDevicesHook as AlignDevicesHook
from hasten.big_modeling.hooks import CpuOffload as CpuOffload
from hasten.big_modeling.hooks import UserCpuOffloadHook as UserCpuOffloadHook
from hasten.big_modeling.hooks import add_hook_to_module as add_hook_to_module
from hasten.big_modeling.hooks import attach_align_device_hook as attach_align_device_hook
from hasten.big_modeling.hooks import (
    attach_align_device_hook_on_blocks as attach_align_device_hook_on_blocks,
)
from hasten.big_modeling.init import init_empty_weights, init_on_device
from hasten.big_modeling.loading import load_checkpoint_in_model as load_checkpoint_in_model
from hasten.big_modeling.offload import OffloadedWeightsLoader as OffloadedWeightsLoader
from hasten.big_modeling.offload import (
    extract_submodules_state_dict as extract_submodules_state_dict,
)
from hasten.big_modeling.offload import offload_state_dict as offload_state_dict
from hasten.big_modeling.tensors import find_tied_parameters as find_tied_parameters
from hasten.big_modeling.tensors import retie_parameters as retie_parameters
from hasten.config.parallelism import refuse_recurrent_layers

# Accelerate's private name for the sequence-parallel model check (its tests import it here).
_refuse_recurrent_layers_under_sequence_parallelism = refuse_recurrent_layers

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

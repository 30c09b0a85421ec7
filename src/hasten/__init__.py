"""hasten: write one plain PyTorch training loop and run it anywhere.

The public surface mirrors Hugging Face Accelerate's top-level names. Every name is resolved
lazily from its real home, so ``import hasten`` costs almost nothing beyond ``import torch``.
"""

from hasten._version import __version__
from hasten.core.lazy import lazy_namespace

_TABLE: dict[str, list[str]] = {
    "hasten.accelerator": ["Accelerator"],
    "hasten.state": ["AcceleratorState", "GradientState", "PartialState"],
    "hasten.big_modeling": [
        "cpu_offload",
        "cpu_offload_with_hook",
        "disk_offload",
        "dispatch_model",
        "init_empty_weights",
        "init_on_device",
        "load_checkpoint_and_dispatch",
    ],
    "hasten.big_modeling.device_map": ["infer_auto_device_map"],
    "hasten.big_modeling.loading": ["load_checkpoint_in_model"],
    "hasten.data_loader": ["skip_first_batches"],
    "hasten.inference": ["prepare_pippy"],
    "hasten.launchers": ["debug_launcher", "notebook_launcher"],
    "hasten.config.enums": ["DDPCommunicationHookType", "DistributedType"],
    "hasten.config.kwargs": [
        "AutocastKwargs",
        "DistributedDataParallelKwargs",
        "GradScalerKwargs",
        "InitProcessGroupKwargs",
        "ProfileKwargs",
    ],
    "hasten.config.project": ["DataLoaderConfiguration"],
    "hasten.config.deepspeed": ["DeepSpeedPlugin"],
    "hasten.config.fsdp": ["FullyShardedDataParallelPlugin"],
    "hasten.config.parallelism": ["ParallelismConfig"],
    "hasten.core.imports": ["is_rich_available"],
    "hasten.platforms.memory": ["find_executable_batch_size"],
    "hasten.ops.random": ["synchronize_rng_states"],
}

__getattr__, __dir__ = lazy_namespace(__name__, _TABLE, globals())

__all__ = sorted(["__version__"] + [name for names in _TABLE.values() for name in names])

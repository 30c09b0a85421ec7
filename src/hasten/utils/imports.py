"""Compatibility path for ``accelerate.utils.imports``.

Package checks live in `hasten.core.imports`; device checks in `hasten.platforms.checks`.
"""

from hasten.core.imports import (
    is_aim_available,
    is_bitsandbytes_available,
    is_clearml_available,
    is_comet_ml_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_package_available,
    is_rich_available,
    is_safetensors_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_torchdata_stateful_dataloader_available,
    is_trackio_available,
    is_transformers_available,
    is_wandb_available,
)
from hasten.platforms.checks import (
    is_bf16_available,
    is_cuda_available,
    is_fp16_available,
    is_mps_available,
    is_npu_available,
    is_torch_xla_available,
    is_xpu_available,
)

__all__ = [
    "is_aim_available",
    "is_bf16_available",
    "is_bitsandbytes_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp16_available",
    "is_matplotlib_available",
    "is_mlflow_available",
    "is_mps_available",
    "is_npu_available",
    "is_package_available",
    "is_rich_available",
    "is_safetensors_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_torch_xla_available",
    "is_torchdata_stateful_dataloader_available",
    "is_trackio_available",
    "is_transformers_available",
    "is_wandb_available",
    "is_xpu_available",
]

"""Compatibility path for ``accelerate.utils.dataclasses``; the classes live in `hasten.config`."""

from hasten.config.deepspeed import (
    DeepSpeedPlugin,
)
from hasten.config.dynamo import (
    TorchDynamoPlugin,
)
from hasten.config.enums import (
    ComputeEnvironment,
    CustomDtype,
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    FP8BackendType,
    LoggerType,
    PrecisionType,
    RNGType,
    SageMakerDistributedType,
)
from hasten.config.fsdp import (
    FullyShardedDataParallelPlugin,
)
from hasten.config.kwargs import (
    AORecipeKwargs,
    AutocastKwargs,
    DistributedDataParallelKwargs,
    FP8Format,
    FP8RecipeKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    MSAMPRecipeKwargs,
    ProfileKwargs,
    TERecipeKwargs,
)
from hasten.config.megatron import (
    MegatronLMPlugin,
)
from hasten.config.project import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from hasten.config.quantization import (
    BnbQuantizationConfig,
)
from hasten.core.nested import (
    TensorInformation,
)

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "BnbQuantizationConfig",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FP8BackendType",
    "FP8Format",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MSAMPRecipeKwargs",
    "MegatronLMPlugin",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchDynamoPlugin",
]

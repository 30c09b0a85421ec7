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
    LoggerType,
    PrecisionType,
    RNGType,
    SageMakerDistributedType,
)
from hasten.config.fsdp import (
    FullyShardedDataParallelPlugin,
)
from hasten.config.kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
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
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MegatronLMPlugin",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TensorInformation",
    "TorchDynamoPlugin",
]

"""Compatibility path for ``accelerate.utils.dataclasses``; the classes live in `hasten.config`."""

from hasten.big_modeling.tensors import (
    get_module_class_from_name,
)
from hasten.config.deepspeed import (
    DeepSpeedPlugin,
)
from hasten.config.dynamo import (
    TorchDynamoPlugin,
)
from hasten.config.enums import (
    BaseEnum,
    ComputeEnvironment,
    CustomDtype,
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    EnumWithContains,
    FP8BackendType,
    LoggerType,
    PrecisionType,
    ProfilerActivity,
    RNGType,
    SageMakerDistributedType,
)
from hasten.config.fsdp import (
    FullyShardedDataParallelPlugin,
)
from hasten.config.kwargs import (
    AmaxComputeAlgorithm,
    AORecipeKwargs,
    AutocastKwargs,
    Backend,
    DistributedDataParallelKwargs,
    FP8Format,
    FP8RecipeKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    MSAMPRecipeKwargs,
    OptLevel,
    ProfileKwargs,
    TERecipeKwargs,
)
from hasten.config.megatron import (
    MegatronLMPlugin,
)
from hasten.config.megatron_models import (
    MODEL_CONFIGS_TO_MEGATRON_PARSERS,
    add_model_config_to_megatron_parser,
    parse_bert_config,
    parse_glm4_moe_config,
    parse_gpt2_config,
    parse_llama_config,
    parse_t5_config,
)
from hasten.config.parallelism import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
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
    "AmaxComputeAlgorithm",
    "AutocastKwargs",
    "Backend",
    "BaseEnum",
    "BnbQuantizationConfig",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "EnumWithContains",
    "FP8BackendType",
    "FP8Format",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MODEL_CONFIGS_TO_MEGATRON_PARSERS",
    "MSAMPRecipeKwargs",
    "MegatronLMPlugin",
    "OptLevel",
    "PrecisionType",
    "ProfileKwargs",
    "ProfilerActivity",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "add_model_config_to_megatron_parser",
    "get_module_class_from_name",
    "parse_bert_config",
    "parse_glm4_moe_config",
    "parse_gpt2_config",
    "parse_llama_config",
    "parse_t5_config",
]

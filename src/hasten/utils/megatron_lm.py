"""Compatibility path for ``accelerate.utils.megatron_lm``; see `hasten.strategies.megatron`."""

from hasten.strategies.megatron.data import (
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    prepare_data_loader,
)
from hasten.strategies.megatron.engine import (
    MegatronEngine,
    MegatronLMOptimizerWrapper,
    MegatronLMSchedulerWrapper,
    avg_losses_across_data_parallel_group,
    finish_mpu_init,
    gather_across_data_parallel_groups,
    initialize,
    model_provider_func,
    prepare_model_optimizer_scheduler,
    prepare_optimizer,
    prepare_scheduler,
)
from hasten.strategies.megatron.train_step import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    T5TrainStep,
)

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronEngine",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMOptimizerWrapper",
    "MegatronLMSchedulerWrapper",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "finish_mpu_init",
    "gather_across_data_parallel_groups",
    "initialize",
    "model_provider_func",
    "prepare_data_loader",
    "prepare_model_optimizer_scheduler",
    "prepare_optimizer",
    "prepare_scheduler",
]

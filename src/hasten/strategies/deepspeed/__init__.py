"""DeepSpeed through the strategy seam: config resolution, engine setup, wrappers, ZeRO helpers.

Nothing here imports deepspeed until an engine is built or a ZeRO helper is used.
"""

from hasten.strategies.deepspeed.dummies import (
    DummyOptim,
    DummyScheduler,
    map_pytorch_optim_to_deepspeed,
)
from hasten.strategies.deepspeed.resolve import EngineInputs, check_batch_sizes, resolve_config
from hasten.strategies.deepspeed.strategy import DeepSpeedStrategy, engine_tag, is_deepspeed_engine
from hasten.strategies.deepspeed.wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)
from hasten.strategies.deepspeed.zero import GatheredParameters, consolidated_state_dict

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DeepSpeedStrategy",
    "DummyOptim",
    "DummyScheduler",
    "EngineInputs",
    "GatheredParameters",
    "check_batch_sizes",
    "consolidated_state_dict",
    "engine_tag",
    "is_deepspeed_engine",
    "map_pytorch_optim_to_deepspeed",
    "resolve_config",
]

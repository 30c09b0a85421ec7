"""Compatibility path for ``accelerate.utils.deepspeed``; the engine lives in `hasten.strategies.deepspeed`."""

from hasten.config.deepspeed import HfDeepSpeedConfig
from hasten.strategies.deepspeed.dummies import (
    DummyOptim,
    DummyScheduler,
    map_pytorch_optim_to_deepspeed,
)
from hasten.strategies.deepspeed.plugins import get_active_deepspeed_plugin
from hasten.strategies.deepspeed.wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
]

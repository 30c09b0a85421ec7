"""How work is split across processes: one `Strategy` object chosen once per Accelerator."""

from hasten.strategies.base import Strategy
from hasten.strategies.ddp import DDPStrategy
from hasten.strategies.select import select_strategy
from hasten.strategies.single import SingleDeviceStrategy
from hasten.strategies.unwired import UnwiredStrategy
from hasten.strategies.unwrap import extract_model_from_parallel

__all__ = [
    "DDPStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "UnwiredStrategy",
    "extract_model_from_parallel",
    "select_strategy",
]

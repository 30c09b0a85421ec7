"""Megatron-LM on megatron-core: arguments, data, train steps, the engine and the strategy."""

from hasten.strategies.megatron.strategy import MegatronStrategy

__all__ = ["MegatronStrategy"]

"""Compatibility path for ``accelerate.utils.random``; the code lives in `hasten.ops.random`."""

from hasten.ops.random import set_seed, synchronize_rng_state, synchronize_rng_states

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]

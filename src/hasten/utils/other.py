"""Compatibility path for ``accelerate.utils.other``.

Unwrapping lives in `hasten.strategies.unwrap`, file I/O in `hasten.checkpointing.io`,
`wait_for_everyone` in `hasten.state`, and `write_basic_config` in `hasten.commands.config.default`.
"""

from hasten.checkpointing.io import load, save
from hasten.commands.config.default import write_basic_config
from hasten.state import wait_for_everyone
from hasten.strategies.unwrap import extract_model_from_parallel

__all__ = ["extract_model_from_parallel", "load", "save", "wait_for_everyone", "write_basic_config"]

"""Private names Accelerate's own tests import or patch, kept at the same paths in hasten.

Accelerate 1.15's test suite (run by ``make conformance``) reaches past the public API: it imports
these names, or patches them in the module that looks them up. Each is the real implementation
or a thin alias; what they do is tested with their implementation.
"""

from __future__ import annotations

import importlib

import pytest

PRIVATE_NAMES = [
    ("hasten.commands.launch", "_validate_launch_command"),
    ("hasten.utils.launch", "_convert_nargs_to_dict"),
    ("hasten.big_modeling", "_refuse_recurrent_layers_under_sequence_parallelism"),
    # patch targets: looked up in the accelerator module at call time
    ("hasten.accelerator", "is_bitsandbytes_multi_backend_available"),
    ("hasten.accelerator", "is_xpu_available"),
    ("hasten.commands.env", "which"),
]


@pytest.mark.parametrize(("module", "name"), PRIVATE_NAMES)
def test_private_name_is_at_accelerates_path(module: str, name: str) -> None:
    assert callable(getattr(importlib.import_module(module), name))

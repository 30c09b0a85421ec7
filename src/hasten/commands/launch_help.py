"""Help output of ``hasten launch``: one spelling per flag, optional sections only when asked.

Flags accept ``--a_b`` and ``--a-b`` (`hasten.commands.utils`); help lists only ``--a_b``.
Sections for a platform or engine (TPU, SageMaker, FSDP, ...) are listed by ``--help`` alone,
and otherwise only when their selecting flag is on the command line, e.g.
``hasten launch --tpu --help``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["CustomHelpFormatter", "OPTIONAL_SECTIONS", "clean_option"]

# Section title -> the flags that select it (after `clean_option`).
OPTIONAL_SECTIONS: dict[str, tuple[str, ...]] = {
    "TPU": ("--tpu", "--tpu_cluster", "--no_tpu_cluster"),
    "AWS (SageMaker)": ("--aws_access_key_id", "--aws_secret_access_key"),
    "FSDP": ("--use_fsdp",),
    "DeepSpeed": ("--use_deepspeed",),
    "Megatron-LM": ("--use_megatron_lm",),
    "fp8 training (with --mixed_precision fp8)": ("--fp8_backend",),
}


def clean_option(option: str) -> str:
    """Return `option` without ``=value`` and with ``-`` after the leading ``--`` made ``_``."""
    option = option.split("=", 1)[0]
    if option.startswith("--"):
        return "--" + option[2:].replace("-", "_")
    return option


def _selected_sections(argv: Sequence[str]) -> set[str] | None:
    """Titles to show for `argv`, or None (show all) when only ``--help`` was given."""
    options = [clean_option(arg) for arg in argv if arg.startswith("-")]
    if not [opt for opt in options if opt not in ("-h", "--help")]:
        return None
    return {title for title, flags in OPTIONAL_SECTIONS.items() if set(flags) & set(options)}


class CustomHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Lists each flag once (``--a_b``) and hides platform sections that were not selected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown = _selected_sections(sys.argv[1:])

    def add_argument(self, action: argparse.Action) -> None:
        """Add `action` to the help with its dashed aliases removed (or hide its section)."""
        shown = copy.copy(action)
        shown.option_strings = [
            opt for opt in action.option_strings if not (opt.startswith("--") and "-" in opt[2:])
        ] or list(action.option_strings)
        title = getattr(getattr(action, "container", None), "title", None)
        if title in OPTIONAL_SECTIONS and self._shown is not None and title not in self._shown:
            shown.help = argparse.SUPPRESS
        super().add_argument(shown)

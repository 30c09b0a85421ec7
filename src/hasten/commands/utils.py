"""Argument parsing shared by the ``hasten`` commands: every ``--a_b`` flag also accepts ``--a-b``.

Accelerate's commands accept both spellings (``--num_processes`` and ``--num-processes``); help
shows only the underscore one (see `hasten.commands.launch.CustomHelpFormatter`).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["CustomArgumentGroup", "CustomArgumentParser", "dashed_aliases"]


def dashed_aliases(option_strings: tuple[str, ...] | list[str]) -> list[str]:
    """Return `option_strings` plus the ``--a-b`` spelling of every ``--a_b`` long option."""
    result = list(option_strings)
    for option in option_strings:
        if option.startswith("--") and "_" in option[2:]:
            dashed = "--" + option[2:].replace("_", "-")
            if dashed not in result:
                result.append(dashed)
    return result


def _is_optional(args: tuple[Any, ...]) -> bool:
    return bool(args) and all(isinstance(arg, str) and arg.startswith("-") for arg in args)


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose ``--a_b`` flags also accept ``--a-b``."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add an argument; long options with ``_`` get a ``-`` alias."""
        if _is_optional(args):
            args = tuple(dashed_aliases(list(args)))
        return super().add_argument(*args, **kwargs)


class CustomArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose ``--a_b`` flags (and groups' flags) accept ``--a-b``."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add an argument; long options with ``_`` get a ``-`` alias."""
        if _is_optional(args):
            args = tuple(dashed_aliases(list(args)))
        return super().add_argument(*args, **kwargs)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> CustomArgumentGroup:
        """Add a group whose arguments get the same aliases."""
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group

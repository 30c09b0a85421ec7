"""The ``hasten`` command: a table of subcommands, each imported only when it runs.

Each module in `COMMANDS` exposes ``register(subparsers) -> None``, which adds its parser and
sets ``func`` (called with the parsed arguments; its return value is the exit code).
``hasten launch ...`` imports only `hasten.commands.launch`, keeping the launcher's start cheap.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hasten._version import __version__
from hasten.commands.utils import CustomArgumentParser
from hasten.compat.alias import ACCELERATE_API_VERSION

__all__ = ["COMMANDS", "build_parser", "main"]

# subcommand -> module exposing register(subparsers). Add a row to add a command.
COMMANDS: dict[str, str] = {
    "accelerate": "hasten.commands.accelerate_alias",
    "config": "hasten.commands.config",
    "env": "hasten.commands.env",
    "estimate-memory": "hasten.commands.estimate",
    "launch": "hasten.commands.launch",
    "merge-weights": "hasten.commands.merge",
    "plot": "hasten.commands.plot",
    "test": "hasten.commands.test",
    "to-fsdp2": "hasten.commands.to_fsdp2",
    "tpu-config": "hasten.commands.tpu",
}

# Errors from bad user input that deserve one clear line rather than a traceback.
_USER_ERRORS = (ValueError, TypeError, FileNotFoundError, ImportError, RuntimeError)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Return the ``hasten`` parser with every subcommand, or only `only` (faster)."""
    parser = argparse.ArgumentParser("hasten", allow_abbrev=False)
    parser.add_argument(
        "--version",
        action="version",
        version=f"hasten {__version__} (the API of Accelerate {ACCELERATE_API_VERSION})",
        help="Print hasten's version and the Accelerate API it implements, then exit.",
    )
    # Every subcommand accepts --a-b for each --a_b flag, as Accelerate's commands do.
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="<command>", parser_class=CustomArgumentParser
    )
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            subparsers.add_parser(name, help=f"(not available: {module_name} is missing)")
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hasten`` with `argv` (default: the command line); return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = args_list[0] if args_list else None
    parser = build_parser(only=first if first in COMMANDS else None)
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 1
    try:
        code = func(args)
    except _USER_ERRORS as err:
        print(f"hasten {args.command}: error: {err}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())

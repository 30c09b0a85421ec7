"""``hasten config``: create (questionnaire or defaults), update and locate config files.

``hasten config`` asks questions on stdin; ``hasten config default`` writes a config for this
machine; ``hasten config update`` rewrites an existing file with today's keys.
"""

from __future__ import annotations

import argparse
from typing import Any

from hasten.commands.config.config import config_command, config_command_parser
from hasten.commands.config.config_args import (
    default_config_file,
    load_config_from_file,
)
from hasten.commands.config.default import default_command_parser
from hasten.commands.config.update import update_command_parser
from hasten.commands.utils import CustomArgumentParser

__all__ = [
    "config_command",
    "config_command_parser",
    "default_config_file",
    "get_config_parser",
    "load_config_from_file",
    "main",
    "register",
]


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten config`` parser with its ``default``/``update`` subcommands."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--config_file",
        default=None,
        help="Where to save/read the config (default: $HF_HOME/accelerate/default_config.yaml).",
    )
    parser = config_command_parser(subparsers)
    commands = parser.add_subparsers(
        title="subcommands", dest="config_subcommand", parser_class=CustomArgumentParser
    )
    default_command_parser(commands, parents=[parent])
    update_command_parser(commands, parents=[parent])
    return parser


def main() -> int:
    """Run ``hasten config`` with the command line (``python -m hasten.commands.config``)."""
    args = get_config_parser().parse_args()
    return int(args.func(args) or 0)


def register(subparsers: Any) -> None:
    """Add ``hasten config`` to the ``hasten`` command table."""
    get_config_parser(subparsers)

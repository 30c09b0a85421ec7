"""``hasten config``: create (questionnaire or defaults), update and locate config files.

``hasten config`` asks questions on stdin; ``hasten config default`` writes a config for this
machine; ``hasten config update`` rewrites an existing file with today's keys.
"""

from __future__ import annotations

import argparse
from typing import Any

from hasten.commands.config.config_args import (
    default_config_file,
    default_config_path,
    load_config_from_file,
)
from hasten.commands.config.default import default_command_parser
from hasten.commands.config.questionnaire import get_cluster_input
from hasten.commands.config.update import update_command_parser

__all__ = [
    "config_command",
    "default_config_file",
    "get_config_parser",
    "load_config_from_file",
    "register",
]


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten config`` parser (added to `subparsers` when given)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--config_file",
        default=None,
        help="Where to save/read the config (default: $HF_HOME/accelerate/default_config.yaml; "
        "a .json suffix writes JSON).",
    )
    description = "Create or update a hasten config file (Accelerate's keys)."
    if subparsers is not None:
        parser = subparsers.add_parser(
            "config", parents=[parent], help=description, description=description
        )
    else:
        parser = argparse.ArgumentParser("hasten config", parents=[parent], description=description)
    commands = parser.add_subparsers(title="subcommands", dest="config_subcommand")
    default_command_parser(commands, parents=[parent])
    update_command_parser(commands, parents=[parent])
    parser.set_defaults(func=config_command)
    return parser


def config_command(args: argparse.Namespace) -> int:
    """Run the ``hasten config`` questionnaire and save the answers."""
    config = get_cluster_input()
    path = config.save(args.config_file or default_config_path())
    print(f"hasten config saved at {path}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``hasten config`` to the ``hasten`` command table."""
    get_config_parser(subparsers)

"""``hasten config update``: rewrite a config file with today's keys and defaults."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hasten.commands.config.config_args import default_config_path, load_config_from_file

__all__ = ["update_command_parser", "update_config", "update_config_command"]


def update_config(args: Any) -> str:
    """Load ``args.config_file`` (default: the default config), translate legacy keys, save it back.

    `args` is the parsed ``hasten config update`` namespace (a path string is accepted too).

    Returns:
        The path of the updated file.

    Raises:
        FileNotFoundError: there is no such file.
        ValueError / TypeError: the file has an unknown key or an invalid value.
    """
    config_file = args if isinstance(args, str | Path | None) else args.config_file
    path = str(config_file or default_config_path())
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"Config file {path!r} does not exist. Pass an existing file with --config_file, "
            "or create one with `hasten config`."
        )
    return load_config_from_file(path).save(path)


def update_command_parser(parser: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``hasten config update`` to the ``config`` subcommands (`parser`)."""
    parser = parser.add_parser(
        "update",
        parents=parents,
        help="Rewrite a config file with the current keys and defaults.",
        description="Load a config file, translate legacy keys, and save it in place.",
    )
    parser.set_defaults(func=update_config_command)


def update_config_command(args: argparse.Namespace) -> int:
    """Run ``hasten config update``."""
    path = update_config(args)
    print(f"Successfully updated the configuration file at {path}.")
    return 0

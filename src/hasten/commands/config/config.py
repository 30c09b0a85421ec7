"""``hasten config`` (the questionnaire): where the job runs, then that environment's questions."""

from __future__ import annotations

import argparse
from typing import Any

from hasten.commands.config.config_args import BaseConfig, default_config_path
from hasten.commands.config.config_utils import SubcommandHelpFormatter
from hasten.commands.config.questionnaire import ask_choice, get_cluster_input
from hasten.commands.config.sagemaker import get_sagemaker_input
from hasten.commands.utils import CustomArgumentParser

__all__ = ["config_command", "config_command_parser", "get_user_input", "main"]

DESCRIPTION = "Create or update a hasten config file (Accelerate's keys)."


def get_user_input() -> BaseConfig:
    """Ask where the job runs (this machine or Amazon SageMaker), then that environment's questions."""
    where = ask_choice(
        "In which compute environment are you running?", ["This machine", "AWS (Amazon SageMaker)"]
    )
    return get_sagemaker_input() if where == 1 else get_cluster_input()


def config_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten config`` parser (added to `subparsers` when given)."""
    if subparsers is not None:
        parser = subparsers.add_parser(
            "config",
            help=DESCRIPTION,
            description=DESCRIPTION,
            formatter_class=SubcommandHelpFormatter,
        )
    else:
        parser = CustomArgumentParser(
            "hasten config", description=DESCRIPTION, formatter_class=SubcommandHelpFormatter
        )
    parser.add_argument(
        "--config_file",
        default=None,
        help="Where to save/read the config (default: $HF_HOME/accelerate/default_config.yaml; "
        "a .json suffix writes JSON).",
    )
    parser.set_defaults(func=config_command)
    return parser


def config_command(args: argparse.Namespace) -> int:
    """Run the ``hasten config`` questionnaire and save the answers."""
    config = get_user_input()
    path = config.save(args.config_file or default_config_path())
    print(f"hasten config saved at {path}")
    return 0


def main() -> int:
    """Run the questionnaire with the command line (``python -m hasten.commands.config.config``)."""
    return config_command(config_command_parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())

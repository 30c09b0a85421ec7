"""``hasten test``: launch the built-in self-check over the current config and report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hasten.commands.launch import launch_command_parser, run_launch
from hasten.commands.utils import CustomArgumentParser

__all__ = ["SELF_CHECK", "main", "register", "test_command", "test_command_parser"]

# The script lives with the test helpers (a layer above this one), so it is found by path.
SELF_CHECK = Path(__file__).resolve().parents[1] / "test_utils" / "scripts" / "self_check.py"


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:  # noqa: PT028
    """Return the ``hasten test`` parser (added to `subparsers` when given)."""
    description = "Run hasten's self-check with the current config and report pass/fail."
    if subparsers is not None:
        parser = subparsers.add_parser("test", help=description, description=description)
    else:
        parser = CustomArgumentParser("hasten test", description=description)
    parser.add_argument("--config_file", default=None, help="Config file to test.")
    parser.set_defaults(func=test_command)
    return parser


def test_command(args: argparse.Namespace) -> int:
    """Run ``hasten test``: the self-check under ``hasten launch``; return its exit code."""
    argv = [] if args.config_file is None else ["--config_file", args.config_file]
    launch_args = launch_command_parser().parse_args([*argv, str(SELF_CHECK)])
    code = run_launch(launch_args, replace_process=False)
    if code == 0:
        print("Test is a success! You are ready for your distributed training!")
    else:
        print(f"hasten test FAILED (exit code {code}); the output above shows which check.")
    return code


def register(subparsers: Any) -> None:
    """Add ``hasten test`` to the ``hasten`` command table."""
    test_command_parser(subparsers)


def main() -> int:
    """Run ``hasten test`` with the command line (``python -m hasten.commands.test``)."""
    return test_command(test_command_parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())

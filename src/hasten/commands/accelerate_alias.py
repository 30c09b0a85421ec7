"""``hasten accelerate install | uninstall | status | build``: hasten as the ``accelerate`` package.

``install`` makes hasten the ``accelerate`` that transformers, trl, peft and diffusers import (an
installed distribution named ``accelerate``; see `hasten.compat.distribution`), ``uninstall``
removes it, ``status`` says which accelerate is active and ``build`` writes the wheel for an
environment that installs it by other means (a requirements file, an image).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hasten.commands.utils import CustomArgumentParser
from hasten.compat import distribution

__all__ = ["accelerate_command", "accelerate_command_parser", "main", "register"]


def accelerate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten accelerate`` parser (added to `subparsers` when given)."""
    description = (
        "Make hasten the `accelerate` package that transformers, trl, peft and diffusers use "
        "(install), undo it (uninstall), or say which accelerate is active (status)."
    )
    if subparsers is not None:
        parser = subparsers.add_parser("accelerate", help=description, description=description)
    else:
        parser = CustomArgumentParser("hasten accelerate", description=description)
    actions = parser.add_subparsers(dest="action", metavar="<action>", required=True)
    install = actions.add_parser("install", help="Install hasten as accelerate (with pip).")
    install.add_argument(
        "--replace",
        action="store_true",
        help="Replace a Hugging Face Accelerate installed in this environment.",
    )
    actions.add_parser("uninstall", help="Remove hasten's accelerate alias (with pip).")
    actions.add_parser("status", help="Say which accelerate is installed and imported.")
    build = actions.add_parser("build", help="Write the accelerate wheel without installing it.")
    build.add_argument("--wheel_dir", default=".", help="Folder for the wheel (default: here).")
    parser.set_defaults(func=accelerate_command)
    return parser


def accelerate_command(args: argparse.Namespace) -> int:
    """Run ``hasten accelerate <action>``; errors are raised for the CLI to print (exit 2)."""
    if args.action == "install":
        print(distribution.install(replace=args.replace))
    elif args.action == "uninstall":
        print(distribution.uninstall())
    elif args.action == "build":
        print(distribution.build_wheel(args.wheel_dir))
    else:
        print("\n".join(distribution.status_lines()))
    return 0


def register(subparsers: Any) -> None:
    """Add ``hasten accelerate`` to the ``hasten`` command table."""
    accelerate_command_parser(subparsers)


def main() -> int:
    """Run ``hasten accelerate`` (``python -m hasten.commands.accelerate_alias``)."""
    try:
        return accelerate_command(accelerate_command_parser().parse_args())
    except distribution.AccelerateAliasError as err:
        print(f"hasten accelerate: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Compatibility path for ``accelerate.commands.accelerate_cli``: the ``hasten`` command itself."""

from __future__ import annotations

import sys

from hasten.commands import cli

__all__ = ["main"]


def main() -> int:
    """Run ``hasten`` with the command line (``python -m hasten.commands.accelerate_cli ...``)."""
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())

"""``hasten merge-weights``: a sharded checkpoint folder -> one safetensors model file.

The result loads anywhere (``safetensors.torch.load_file`` or ``load_checkpoint_in_model``).
Called from every process of a job (as Accelerate's tests do), the main process merges and the
others wait for it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hasten.checkpointing.merge import merge_on_main_process
from hasten.commands.utils import CustomArgumentParser

__all__ = ["main", "merge_command", "merge_command_parser", "register"]


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten merge-weights`` parser (added to `subparsers` when given)."""
    description = "Merge a sharded (torch.distributed.checkpoint) folder into one model file."
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", help=description, description=description)
    else:
        parser = CustomArgumentParser("hasten merge-weights", description=description)
    parser.add_argument(
        "checkpoint_directory", help="the sharded checkpoint folder (.distcp files + .metadata)"
    )
    parser.add_argument("output_path", help="folder to write model.safetensors into")
    parser.add_argument(
        "--unsafe_serialization",
        action="store_true",
        help="write pytorch_model.bin (a pickle) instead of model.safetensors",
    )
    parser.add_argument(
        "--remove_checkpoint_dir",
        action="store_true",
        help="delete the sharded folder once the merged file is written",
    )
    parser.set_defaults(func=merge_command)
    return parser


def merge_command(args: argparse.Namespace) -> int:
    """Run ``hasten merge-weights``; print where the merged model is."""
    path = merge_on_main_process(
        args.checkpoint_directory,
        args.output_path,
        safe_serialization=not args.unsafe_serialization,
        remove_checkpoint_dir=args.remove_checkpoint_dir,
    )
    print(f"Merged weights saved to {path}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``hasten merge-weights`` to the ``hasten`` command table."""
    merge_command_parser(subparsers)


def main() -> int:
    """Run ``hasten merge-weights`` with the command line (``python -m hasten.commands.merge``)."""
    return merge_command(merge_command_parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())

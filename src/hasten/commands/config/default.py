"""``hasten config default`` and `write_basic_config`: a config for this machine, no questions."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hasten.commands.config.config_args import ClusterConfig, default_json_config_file
from hasten.config.enums import DistributedType, PrecisionType, enum_value, parse_mixed_precision

__all__ = ["default_command_parser", "default_config_command", "write_basic_config"]


def _machine() -> tuple[int, str, bool]:
    """Return (device count, distributed type, use_cpu) for this machine."""
    from hasten.platforms.registry import current_platform  # deferred: imports torch

    platform = current_platform()
    count = 0 if platform.name == "cpu" else int(platform.device_count())
    if count == 0:
        return 1, DistributedType.NO.value, True
    if count == 1:
        return 1, DistributedType.NO.value, False
    return count, enum_value(platform.distributed_type), False


def write_basic_config(
    mixed_precision: str = "no", save_location: str = default_json_config_file
) -> str | bool:
    """Write a config for this machine: one process per accelerator, or 1 process on CPU.

    A quick alternative to the `hasten config` questionnaire. The file is YAML unless
    `save_location` ends in ``.json``.

    Args:
        mixed_precision: "no", "fp16", "bf16" or "fp8".
        save_location: where to write; pass it to ``hasten launch --config_file`` if it is not
            the default (``$HF_HOME/accelerate/default_config.yaml``).

    Returns:
        The path written, or False when a file already exists there (it is left untouched).

    Raises:
        ValueError: `mixed_precision` is not one of the allowed values.
    """
    value = parse_mixed_precision(mixed_precision, "write_basic_config(mixed_precision=...)")
    path = Path(save_location).expanduser()
    if path.exists():
        print(
            f"Config file already exists at {path}; not overwriting it. "
            "Use `hasten config` or edit it to change it."
        )
        return False
    num_processes, distributed_type, use_cpu = _machine()
    config = ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        distributed_type=distributed_type,
        mixed_precision=value,
        use_cpu=use_cpu,
        debug=False,
        num_processes=num_processes,
    )
    return config.save(str(path))


def default_command_parser(parser: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``hasten config default`` to the ``config`` subcommands (`parser`)."""
    parser = parser.add_parser(
        "default",
        parents=parents,
        help="Write a config for this machine without asking questions.",
        description="Write a config for this machine (one process per accelerator, or CPU).",
    )
    parser.add_argument(
        "--mixed_precision",
        type=str.lower,
        default="no",
        choices=PrecisionType.list(),
        help="Mixed precision to store (default no).",
    )
    parser.set_defaults(func=default_config_command)


def default_config_command(args: argparse.Namespace) -> int:
    """Run ``hasten config default``."""
    location = args.config_file or default_json_config_file
    written = write_basic_config(args.mixed_precision, location)
    if written:
        print(f"hasten config saved at {written}")
    return 0

"""``hasten to-fsdp2``: rewrite an FSDP1 config file's ``fsdp_config`` into FSDP2 keys.

``fsdp_sharding_strategy`` becomes ``fsdp_reshard_after_forward`` (FULL_SHARD / HYBRID_SHARD ->
true, SHARD_GRAD_OP / HYBRID_SHARD_ZERO2 / NO_SHARD -> false); keys FSDP2 has no use for
(``fsdp_backward_prefetch``, ``fsdp_sync_module_states``, ``fsdp_use_orig_params``) are removed,
and ``fsdp_forward_prefetch`` (not implemented by FSDP2) is removed with a warning.
"""

from __future__ import annotations

import argparse
import enum
import logging
import sys
from pathlib import Path
from typing import Any

from hasten.commands.utils import CustomArgumentParser

__all__ = [
    "ARGUMENT_KEY_MAPPING",
    "ARGUMENT_VALUE_MAPPING",
    "ConversionStatus",
    "convert_config_to_fsdp2",
    "load_config",
    "main",
    "register",
    "to_fsdp2_command",
    "to_fsdp2_command_parser",
]

logger = logging.getLogger(__name__)


class ConversionStatus(enum.Enum):
    """What happens to an FSDP1 key that has no FSDP2 counterpart."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


_RESHARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}

#: FSDP1 key -> FSDP2 key (same name if kept) or what happens to it.
ARGUMENT_KEY_MAPPING: dict[str, str | ConversionStatus] = {
    "fsdp_version": "fsdp_version",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}

#: Value translations of renamed keys.
ARGUMENT_VALUE_MAPPING: dict[str, dict[Any, Any]] = {
    "fsdp_sharding_strategy": dict(_RESHARD),
    "fsdp_reshard_after_forward": dict(_RESHARD),
}


def load_config(config_file: str) -> dict:
    """Read a YAML or JSON config file into a dict.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    path = Path(config_file)
    if not path.is_file():
        raise FileNotFoundError(f"Config file {config_file!r} not found; pass --config_file PATH.")
    text = path.read_text()
    if path.suffix == ".json":
        import json

        return dict(json.loads(text))
    import yaml  # deferred: only this command reads YAML here

    return dict(yaml.safe_load(text) or {})


def _convert_key(key: str, value: Any, out: dict[str, Any]) -> None:
    target = ARGUMENT_KEY_MAPPING.get(key, key)
    if target is ConversionStatus.REMOVED:
        return
    if target is ConversionStatus.NOT_YET_IMPLEMENTED:
        logger.warning("%s is not implemented by FSDP2 yet; it was removed from the config.", key)
        return
    values = ARGUMENT_VALUE_MAPPING.get(key)
    if values is not None and isinstance(value, str):
        upper = value.upper()
        if upper not in values:
            raise ValueError(
                f"{key}={value!r} is not a known FSDP1 sharding strategy; use one of "
                f"{sorted(values)}."
            )
        value = values[upper]
    out[str(target)] = value


def convert_config_to_fsdp2(config: dict) -> dict:
    """Return ``config`` with its ``fsdp_config`` in FSDP2 keys and ``fsdp_version: 2``."""
    fsdp = dict(config.get("fsdp_config") or {})
    if not fsdp:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if int(fsdp.get("fsdp_version", 1)) == 2:
        logger.warning(
            "Config already specifies FSDP2, skipping conversion... (hasten: if its keys are "
            "still FSDP1's, set fsdp_version: 1 and run to-fsdp2 again.)"
        )
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp.items():
        _convert_key(key, value, converted)
    converted["fsdp_version"] = 2
    return {**config, "fsdp_config": converted}


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten to-fsdp2`` parser (added to `subparsers` when given)."""
    description = "Rewrite an FSDP1 config file into FSDP2 keys."
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", help=description, description=description)
    else:
        parser = CustomArgumentParser("hasten to-fsdp2", description=description)
    parser.add_argument("--config_file", required=True, help="the FSDP1 config file")
    parser.add_argument(
        "--output_file",
        default=None,
        help="where to write the FSDP2 config (default with --overwrite: the config file itself)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --output_file if it exists (or, without --output_file, the config file)",
    )
    parser.set_defaults(func=to_fsdp2_command)
    return parser


def to_fsdp2_command(args: Any) -> int:
    """Run ``hasten to-fsdp2``.

    Raises:
        FileNotFoundError: the config file does not exist.
        ValueError: neither ``--output_file`` nor ``--overwrite`` was given.
        FileExistsError: the output exists and ``--overwrite`` was not given.
    """
    if not Path(args.config_file).is_file():
        raise FileNotFoundError(
            f"Config file {args.config_file} not found. (hasten: pass an existing --config_file.)"
        )
    if args.output_file is None and not args.overwrite:
        raise ValueError(
            "If --overwrite is not set, --output_file must be provided. (hasten: name the new "
            "file, or pass --overwrite to rewrite the config file in place.)"
        )
    output = Path(args.output_file if args.output_file is not None else args.config_file)
    if output.exists() and not args.overwrite:
        raise FileExistsError(
            f"Output file {output} already exists and --overwrite is not set. (hasten: pass "
            "--overwrite to replace it, or choose another --output_file.)"
        )
    converted = convert_config_to_fsdp2(load_config(args.config_file))
    import yaml  # deferred

    output.write_text(yaml.safe_dump(converted, sort_keys=False))
    print(f"FSDP2 config written to {output}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``hasten to-fsdp2`` to the ``hasten`` command table."""
    to_fsdp2_command_parser(subparsers)


def main() -> int:
    """Run ``hasten to-fsdp2`` with the command line (``python -m hasten.commands.to_fsdp2``)."""
    return to_fsdp2_command(to_fsdp2_command_parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())

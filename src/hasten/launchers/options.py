"""Engine launch settings as data: one `LaunchOption` row per flag.

Each row names the ``hasten launch`` flag, its type, choices and help, the config-file key
(inside its section, e.g. ``fsdp_config``) and the worker variable the plugin reads. The launch
parser, the flags -> worker-variable step and the config-file -> worker-variable step are all
generated from these rows, so a new setting is one new row. (FSDP rows here; DeepSpeed and
parallelism rows go in the same table.)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hasten.config import envvars

__all__ = ["ENGINE_SWITCHES", "LAUNCH_OPTIONS", "LaunchOption", "add_option_flags", "option_env"]

_SHARDING = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
_BOOL_CHOICES = ["true", "false"]


def _bool(text: str) -> str:
    """argparse type of boolean flags: accepts true/false/1/0/yes/no, passes 'true'/'false'."""
    try:
        return "true" if envvars.parse_bool(text) else "false"
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false") from None


@dataclass(frozen=True)
class LaunchOption:
    """One launch setting: ``--flag`` (type, choices, help), config key and worker variable."""

    flag: str
    env: str
    help: str
    section: str = "fsdp_config"
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        """The argparse attribute (and the config key inside `section`)."""
        return self.flag.removeprefix("--")


#: ``--use_<engine>`` switches and the variable each sets to "true".
ENGINE_SWITCHES = {"--use_fsdp": "ACCELERATE_USE_FSDP"}

LAUNCH_OPTIONS: tuple[LaunchOption, ...] = (
    LaunchOption("--fsdp_version", "FSDP_VERSION", "FSDP version: 1 or 2.", choices=("1", "2")),
    LaunchOption(
        "--fsdp_sharding_strategy",
        "FSDP_SHARDING_STRATEGY",
        "FSDP1 sharding strategy.",
        type=str.upper,
        choices=tuple(_SHARDING),
    ),
    LaunchOption(
        "--fsdp_reshard_after_forward",
        "FSDP_RESHARD_AFTER_FORWARD",
        "FSDP2: true/false (reshard parameters after forward); FSDP1: a sharding strategy.",
    ),
    LaunchOption(
        "--fsdp_auto_wrap_policy",
        "FSDP_AUTO_WRAP_POLICY",
        "Which modules get their own shard group.",
        type=str.upper,
        choices=("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"),
    ),
    LaunchOption(
        "--fsdp_transformer_layer_cls_to_wrap",
        "FSDP_TRANSFORMER_CLS_TO_WRAP",
        "Comma-separated layer class names for transformer_based_wrap (e.g. BertLayer).",
    ),
    LaunchOption(
        "--fsdp_min_num_params",
        "FSDP_MIN_NUM_PARAMS",
        "size_based_wrap: minimum parameters of a wrapped module.",
        type=int,
    ),
    LaunchOption(
        "--fsdp_offload_params",
        "FSDP_OFFLOAD_PARAMS",
        "Offload parameters and gradients to CPU memory.",
        type=_bool,
    ),
    LaunchOption(
        "--fsdp_state_dict_type",
        "FSDP_STATE_DICT_TYPE",
        "How save_state writes models: sharded (every process, DCP) or full (gathered).",
        type=str.upper,
        choices=("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"),
    ),
    LaunchOption(
        "--fsdp_backward_prefetch",
        "FSDP_BACKWARD_PREFETCH",
        "FSDP1 backward prefetch.",
        type=str.upper,
        choices=("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"),
    ),
    LaunchOption(
        "--fsdp_forward_prefetch",
        "FSDP_FORWARD_PREFETCH",
        "FSDP1: prefetch the next all-gather in forward.",
        type=_bool,
    ),
    LaunchOption(
        "--fsdp_use_orig_params",
        "FSDP_USE_ORIG_PARAMS",
        "FSDP1: optimizers see the original parameters.",
        type=_bool,
    ),
    LaunchOption(
        "--fsdp_cpu_ram_efficient_loading",
        "FSDP_CPU_RAM_EFFICIENT_LOADING",
        "Only rank 0 holds the real weights; they are broadcast while sharding.",
        type=_bool,
    ),
    LaunchOption(
        "--fsdp_sync_module_states",
        "FSDP_SYNC_MODULE_STATES",
        "FSDP1: broadcast module states from rank 0.",
        type=_bool,
    ),
    LaunchOption(
        "--fsdp_activation_checkpointing",
        "FSDP_ACTIVATION_CHECKPOINTING",
        "Recompute each wrapped block's activations in backward.",
        type=_bool,
    ),
)


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--use_fsdp`` switch and every `LAUNCH_OPTIONS` flag to ``parser``."""
    group = parser.add_argument_group("FSDP (fsdp_config in config files; FSDP_* variables)")
    for flag in ENGINE_SWITCHES:
        group.add_argument(flag, action="store_true", default=None, help="Shard with FSDP.")
    for option in LAUNCH_OPTIONS:
        choices = list(option.choices) if option.choices else None
        group.add_argument(option.flag, type=option.type, choices=choices, help=option.help)


def option_env(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, str]:
    """The worker variables of the flags that were given (``--fsdp_*`` imply ``--use_fsdp``)."""
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    env: dict[str, str] = {}
    for flag, variable in ENGINE_SWITCHES.items():
        if values.get(flag.removeprefix("--")):
            env[variable] = "true"
    for option in LAUNCH_OPTIONS:
        value = values.get(option.dest)
        if value is not None:
            env[option.env] = str(value)
    if any(name.startswith("FSDP_") for name in env):
        env.setdefault("ACCELERATE_USE_FSDP", "true")
    return env

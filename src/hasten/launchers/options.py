"""Engine launch settings as data: one `LaunchOption` row per flag.

Each row names the ``hasten launch`` flag, its type, choices and help, the config-file key
(inside its section, e.g. ``fsdp_config``) and the worker variable the plugin reads. The launch
parser, the flags -> worker-variable step and the config-file -> worker-variable step are all
generated from these rows, so a new setting is one new row (FSDP, ParallelismConfig and
Megatron-LM rows here; DeepSpeed rows go in the same table).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hasten.config import envvars

__all__ = [
    "DS_FIELDS_VARIABLE",
    "ENGINE_SWITCHES",
    "LAUNCH_OPTIONS",
    "LaunchOption",
    "add_option_flags",
    "check_parallelism_sizes",
    "option_env",
    "prepare_extend_env_parallelism_config",
]

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
ENGINE_SWITCHES = {
    "--use_fsdp": "ACCELERATE_USE_FSDP",
    "--use_parallelism_config": "ACCELERATE_USE_PARALLELISM_CONFIG",
    "--use_megatron_lm": "ACCELERATE_USE_MEGATRON_LM",
    "--use_deepspeed": "ACCELERATE_USE_DEEPSPEED",
}
_SWITCH_HELP = {
    "--use_deepspeed": "Train with DeepSpeed (ZeRO; on CPU over gloo).",
    "--use_fsdp": "Shard with FSDP.",
    "--use_parallelism_config": "Lay the processes out on a ParallelismConfig device mesh.",
    "--use_megatron_lm": "Train with Megatron-LM (megatron-core; CUDA GPUs).",
}
# Section -> (argument group title, variable prefix its rows imply, the switch they imply).
_GROUPS = {
    "fsdp_config": ("FSDP (fsdp_config in config files; FSDP_* variables)", "FSDP_"),
    "parallelism_config": (
        "N-D parallelism (parallelism_config in config files; PARALLELISM_CONFIG_* variables)",
        "PARALLELISM_CONFIG_",
    ),
    "megatron_lm_config": (
        "Megatron-LM (megatron_lm_config in config files; MEGATRON_LM_* variables)",
        "MEGATRON_LM_",
    ),
    "deepspeed_config": (
        "DeepSpeed (deepspeed_config in config files; ACCELERATE_DEEPSPEED_* variables)",
        "ACCELERATE_DEEPSPEED_",
    ),
}
_IMPLIED = {
    "FSDP_": "ACCELERATE_USE_FSDP",
    "PARALLELISM_CONFIG_": "ACCELERATE_USE_PARALLELISM_CONFIG",
    "MEGATRON_LM_": "ACCELERATE_USE_MEGATRON_LM",
    "ACCELERATE_DEEPSPEED_": "ACCELERATE_USE_DEEPSPEED",
}
#: Where the DeepSpeed rows record which settings came from the launcher (a DeepSpeed config
#: file given as well must not silently override them; `DeepSpeedPlugin` checks).
DS_FIELDS_VARIABLE = "ACCELERATE_CONFIG_DS_FIELDS"


def _deepspeed(name: str, env: str, help_text: str, **kwargs: Any) -> LaunchOption:
    return LaunchOption(f"--{name}", env, help_text, section="deepspeed_config", **kwargs)


_DEEPSPEED_OPTIONS: tuple[LaunchOption, ...] = (
    _deepspeed("deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE", "DeepSpeed JSON."),
    _deepspeed(
        "zero_stage",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE",
        "ZeRO stage: 0 (off), 1 (optimizer states), 2 (+gradients), 3 (+parameters).",
        choices=("0", "1", "2", "3"),
    ),
    _deepspeed(
        "offload_optimizer_device",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
        "Where ZeRO 2/3 keeps optimizer states.",
        type=str.lower,
        choices=("none", "cpu", "nvme"),
    ),
    _deepspeed(
        "offload_param_device",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
        "Where ZeRO-3 keeps parameters.",
        type=str.lower,
        choices=("none", "cpu", "nvme"),
    ),
    _deepspeed(
        "offload_optimizer_nvme_path",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
        "NVMe folder for optimizer offload.",
    ),
    _deepspeed(
        "offload_param_nvme_path",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
        "NVMe folder for parameter offload.",
    ),
    _deepspeed(
        "gradient_clipping",
        "ACCELERATE_GRADIENT_CLIPPING",
        "Gradient-norm clipping value of the DeepSpeed config.",
        type=float,
    ),
    _deepspeed(
        "zero3_init_flag",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT",
        "Build models already partitioned (ZeRO-3, transformers models).",
        type=_bool,
    ),
    _deepspeed(
        "zero3_save_16bit_model",
        "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
        "Gather 16-bit weights when saving a ZeRO-3 model.",
        type=_bool,
    ),
    _deepspeed(
        "deepspeed_moe_layer_cls_names",
        "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
        "Comma-separated MoE layer class names (kept whole under ZeRO-3).",
    ),
)


def _parallelism(name: str, help_text: str, **kwargs: Any) -> LaunchOption:
    return LaunchOption(
        f"--parallelism_config_{name}",
        f"PARALLELISM_CONFIG_{name.upper()}",
        help_text,
        section="parallelism_config",
        **kwargs,
    )


def _megatron(name: str, help_text: str, **kwargs: Any) -> LaunchOption:
    return LaunchOption(
        f"--megatron_lm_{name}",
        f"MEGATRON_LM_{name.upper()}",
        help_text,
        section="megatron_lm_config",
        **kwargs,
    )


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
    _parallelism("dp_replicate_size", "Replicated data-parallel degree (DDP/HSDP).", type=int),
    _parallelism("dp_shard_size", "Sharded data-parallel degree (FSDP2).", type=int),
    _parallelism("tp_size", "Tensor-parallel degree (the model's tp_plan).", type=int),
    _parallelism("cp_size", "Context-parallel degree (FSDP2, GPU only).", type=int),
    _parallelism("cp_backend", "Context-parallel backend.", choices=("torch",)),
    _parallelism(
        "cp_comm_strategy",
        "How context-parallel shards exchange keys/values.",
        choices=("allgather", "alltoall"),
    ),
    _parallelism("sp_size", "Sequence-parallel degree (DeepSpeed Ulysses).", type=int),
    _parallelism("sp_backend", "Sequence-parallel backend.", choices=("deepspeed",)),
    _parallelism("sp_seq_length", "Fixed sequence length for sequence parallelism.", type=int),
    _parallelism(
        "sp_seq_length_is_variable", "Sequence length varies between batches.", type=_bool
    ),
    _parallelism("sp_attn_implementation", "Attention kernel for sequence parallelism."),
    _megatron("tp_degree", "Megatron-LM tensor-parallel degree.", type=int),
    _megatron("pp_degree", "Megatron-LM pipeline-parallel degree.", type=int),
    _megatron("num_micro_batches", "Micro-batches per pipeline step.", type=int),
    _megatron("sequence_parallelism", "Sequence parallelism (with tp > 1).", type=_bool),
    _megatron("recompute_activations", "Selective activation recomputation.", type=_bool),
    _megatron("use_distributed_optimizer", "Shard optimizer states over dp ranks.", type=_bool),
    _megatron("gradient_clipping", "Global gradient-norm clipping (0 disables).", type=float),
    *_DEEPSPEED_OPTIONS,
)


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--use_*`` switches and every `LAUNCH_OPTIONS` flag to ``parser``."""
    groups = {section: parser.add_argument_group(title) for section, (title, _) in _GROUPS.items()}
    for flag, variable in ENGINE_SWITCHES.items():
        section = next(s for s, (_, prefix) in _GROUPS.items() if _IMPLIED[prefix] == variable)
        groups[section].add_argument(
            flag, action="store_true", default=None, help=_SWITCH_HELP[flag]
        )
    for option in LAUNCH_OPTIONS:
        choices = list(option.choices) if option.choices else None
        groups[option.section].add_argument(
            option.flag, type=option.type, choices=choices, help=option.help
        )


def option_env(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, str]:
    """The worker variables of the flags that were given (``--fsdp_*`` imply ``--use_fsdp``)."""
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    env: dict[str, str] = {}
    # An engine switched off explicitly (``use_fsdp=False`` in a namespace built by hand, as
    # Accelerate's helpers take) keeps its section's values out, as in Accelerate.
    off = set()
    for flag, variable in ENGINE_SWITCHES.items():
        switch = values.get(flag.removeprefix("--"))
        if switch:
            env[variable] = "true"
        elif switch is False:
            off.add(variable)
    options = [o for o in LAUNCH_OPTIONS if _IMPLIED[_GROUPS[o.section][1]] not in off]
    for option in options:
        value = values.get(option.dest)
        if value is not None:
            env[option.env] = str(value)
    given = [o.dest for o in _DEEPSPEED_OPTIONS if o in options and values.get(o.dest) is not None]
    if given:
        env[DS_FIELDS_VARIABLE] = ",".join(given)
        env.setdefault("ACCELERATE_USE_DEEPSPEED", "true")
    for prefix, switch in _IMPLIED.items():
        if any(name.startswith(prefix) for name in env):
            env.setdefault(switch, "true")
    return env


def prepare_extend_env_parallelism_config(
    args: argparse.Namespace, current_env: dict[str, str]
) -> dict[str, str]:
    """Add the ``--parallelism_config_*`` flags' worker variables to ``current_env``; return it."""
    for name, value in option_env(args).items():
        if name.startswith("PARALLELISM_CONFIG_") or name == "ACCELERATE_USE_PARALLELISM_CONFIG":
            current_env[name] = value
    return current_env


_SIZE_VARIABLES = tuple(
    f"PARALLELISM_CONFIG_{dim}_SIZE" for dim in ("DP_REPLICATE", "DP_SHARD", "TP", "CP", "SP")
)


def check_parallelism_sizes(env: Mapping[str, str], num_processes: int | None) -> None:
    """Refuse a launch whose ParallelismConfig sizes cannot multiply to the process count.

    Raises:
        ValueError: the sizes' product differs from ``num_processes`` (says both).
    """
    sizes = {name: int(env[name]) for name in _SIZE_VARIABLES if env.get(name)}
    product = math.prod(sizes.values())
    if not sizes or product == 1 or num_processes is None or product == num_processes:
        return
    if env.get("PARALLELISM_CONFIG_SP_SIZE") and env.get("ACCELERATE_USE_DEEPSPEED"):
        return  # DeepSpeed's sequence parallelism lays out its own groups
    shown = " x ".join(
        f"{k.removeprefix('PARALLELISM_CONFIG_').lower()}={v}" for k, v in sizes.items()
    )
    raise ValueError(
        f"The parallelism_config sizes multiply to {product} ({shown}), but the launch starts "
        f"{num_processes} process(es); use --num_processes {product} or change the sizes so "
        "their product is the number of processes"
    )

"""Turn a `LaunchPlan` into the environment variables every worker starts with.

The names are the ``ACCELERATE_*`` variables that `PartialState` and the plugins read (see
`hasten.config.envvars`), so a script sees the same settings whether it was started by
`hasten launch`, `torchrun` with those variables, or `notebook_launcher`.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping
from typing import Any

from hasten.config import envvars
from hasten.config.enums import enum_value
from hasten.launchers.options import LAUNCH_OPTIONS
from hasten.launchers.plan import LaunchPlan

__all__ = [
    "apply_worker_env",
    "check_section_keys",
    "plugin_env",
    "section_keys",
    "setup_fp8_env",
    "worker_env",
]

# distributed_type in a config file -> the flag variable that switches the engine on.
_ENGINE_FLAGS = {
    "DEEPSPEED": "ACCELERATE_USE_DEEPSPEED",
    "FSDP": "ACCELERATE_USE_FSDP",
    "MEGATRON_LM": "ACCELERATE_USE_MEGATRON_LM",
}
# Config keys whose variable name is not simply the key upper-cased after a prefix.
_RENAMED = {
    "fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP",
    "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "deepspeed_moe_layer_cls_names": "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
}
# Renamed variables -> the section whose key they carry.
_SECTIONS_OF = {
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "fsdp_config",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": "deepspeed_config",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": "deepspeed_config",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "deepspeed_config",
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "deepspeed_config",
}
# Config section -> prefix of the variables its keys become.
_SECTIONS = {
    "fsdp_config": ("fsdp_", "FSDP_"),
    "deepspeed_config": ("", "ACCELERATE_DEEPSPEED_"),
    "megatron_lm_config": ("megatron_lm_", "MEGATRON_LM_"),
    "fp8_config": ("fp8_", "ACCELERATE_FP8_"),
    "parallelism_config": ("parallelism_config_", "PARALLELISM_CONFIG_"),
}
# The three "keep this GEMM in higher precision" flags of override_linear_precision.
_FP8_OVERRIDES = ("FPROP", "DGRAD", "WGRAD")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(enum_value(item) for item in value)
    return enum_value(value)


# Keys of the sections that `check_section_keys` validates and that are read by the launcher
# itself (DeepSpeed's multi-machine launch, the top-level accumulation) rather than a variable.
_LAUNCHER_KEYS = {
    "fsdp_config": frozenset(),
    "deepspeed_config": frozenset(
        {
            "gradient_accumulation_steps",
            "deepspeed_hostfile",
            "deepspeed_exclusion_filter",
            "deepspeed_inclusion_filter",
            "deepspeed_multinode_launcher",
        }
    ),
}


def _variable(key: str, section: str) -> str:
    strip, prefix = _SECTIONS[section]
    renamed = {**_RENAMED, **{option.dest: option.env for option in LAUNCH_OPTIONS}}
    return renamed.get(key) or prefix + key.removeprefix(strip).upper()


def section_keys(section: str) -> list[str]:
    """Every key `section` (``fsdp_config`` or ``deepspeed_config``) of a config file accepts."""
    strip, prefix = _SECTIONS[section]
    keys = set(_LAUNCHER_KEYS[section])
    keys.update(option.dest for option in LAUNCH_OPTIONS if option.section == section)
    keys.update(key for key, name in _RENAMED.items() if _SECTIONS_OF.get(name) == section)
    renamed_targets = set(_RENAMED.values())  # reached through their own key, not the derived one
    for name in envvars.ENV_VARS:
        if name.startswith(prefix) and name not in renamed_targets:
            keys.add(strip + name.removeprefix(prefix).lower())
    known = (key for key in keys if _variable(key, section) in envvars.ENV_VARS)
    return sorted({*known, *_LAUNCHER_KEYS[section]})


def check_section_keys(config: Mapping[str, Any], source: str = "the config file") -> None:
    """Raise ValueError on an unknown key in ``fsdp_config`` or ``deepspeed_config``, with a guess."""
    for section in _LAUNCHER_KEYS:
        given = config.get(section) or {}
        allowed = section_keys(section)
        for key in given:
            if key in allowed:
                continue
            close = difflib.get_close_matches(str(key), allowed, n=1)
            guess = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"Unknown key {key!r} in {section} of {source}.{guess} The keys {section} "
                f"accepts: {', '.join(allowed)}. Fix or remove that line."
            )


def plugin_env(config: Mapping[str, Any]) -> dict[str, str]:
    """Return the variables that carry a config file's engine sections to the workers.

    ``distributed_type: FSDP`` sets ``ACCELERATE_USE_FSDP=true`` and each ``fsdp_config`` key
    ``fsdp_x`` becomes ``FSDP_X``; DeepSpeed keys become ``ACCELERATE_DEEPSPEED_*`` and
    Megatron-LM keys ``MEGATRON_LM_*``. Keys without a variable in the table are left out
    (the plugin reads them from its own config).
    """
    renamed = {**_RENAMED, **{option.dest: option.env for option in LAUNCH_OPTIONS}}
    values: dict[str, str] = {}
    flag = _ENGINE_FLAGS.get(enum_value(config.get("distributed_type", "")).upper())
    if flag is not None:
        values[flag] = "true"
    for section, (strip, prefix) in _SECTIONS.items():
        for key, value in (config.get(section) or {}).items():
            if key.removeprefix(strip) == "override_linear_precision" and value is not None:
                values.update(_fp8_overrides(value))
                continue
            name = renamed.get(key) or prefix + key.removeprefix(strip).upper()
            if value is not None and name in envvars.ENV_VARS:
                values[name] = _text(value)
    if any(name.startswith("PARALLELISM_CONFIG_") for name in values):
        values["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    return values


def _fp8_overrides(value: Any) -> dict[str, str]:
    flags = [str(item).strip() for item in (value.split(",") if isinstance(value, str) else value)]
    if len(flags) != 3:
        raise ValueError(
            f"fp8 override_linear_precision={value!r} must be three booleans (fprop, dgrad, "
            "wgrad), e.g. --fp8_override_linear_precision false,false,true"
        )
    return {
        f"ACCELERATE_FP8_OVERRIDE_{gemm}": _text(flag) for gemm, flag in zip(_FP8_OVERRIDES, flags)
    }


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Put the ``--fp8_*`` launch flags that were given into ``current_env`` and return it.

    ``--fp8_backend ao`` becomes ``ACCELERATE_FP8_BACKEND=AO``, ``--fp8_format E4M3``
    ``ACCELERATE_FP8_FORMAT=E4M3``; the precision override triple becomes three variables.
    """
    for name, value in sorted(vars(args).items()):
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            current_env.update(_fp8_overrides(value))
        elif name == "fp8_backend":
            current_env["ACCELERATE_FP8_BACKEND"] = str(value).upper()
        else:
            current_env[f"ACCELERATE_{name.upper()}"] = _text(value)
    return current_env


def _default_threads(plan: LaunchPlan, environ: Mapping[str, str]) -> int | None:
    """Threads per worker when the user chose none: share the cores, like torchrun's 1 thread."""
    if plan.num_cpu_threads_per_process is not None:
        return plan.num_cpu_threads_per_process
    if environ.get("OMP_NUM_THREADS") or plan.nproc_per_node == 1:
        return None
    return max(1, (os.cpu_count() or 1) // plan.nproc_per_node)


_KMP_CPU = {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"}


def worker_env(
    plan: LaunchPlan,
    environ: Mapping[str, str] | None = None,
    plugin_values: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return the variables to add to the launcher's environment for every worker.

    Args:
        plan: the validated launch plan.
        environ: the launcher's current environment (defaults to the process environment).
        plugin_values: engine variables from the config file (`plugin_env`), set before the
            plan's own settings so flags still win.
    """
    current = envvars.snapshot() if environ is None else environ
    values: dict[str, str] = dict(plugin_values or {})
    values.update(
        {
            "ACCELERATE_MIXED_PRECISION": plan.mixed_precision,
            "ACCELERATE_USE_CPU": _text(plan.use_cpu),
            "ACCELERATE_DEBUG_MODE": _text(plan.debug),
            "ACCELERATE_DYNAMO_BACKEND": plan.dynamo_backend,
            "ACCELERATE_DYNAMO_MODE": plan.dynamo_mode,
            "ACCELERATE_DYNAMO_USE_FULLGRAPH": _text(plan.dynamo_use_fullgraph),
            "ACCELERATE_DYNAMO_USE_DYNAMIC": _text(plan.dynamo_use_dynamic),
            "ACCELERATE_NUM_PROCESSES": str(plan.num_processes),
        }
    )
    steps_given = plan.sources.get("gradient_accumulation_steps", "given") != "default"
    if steps_given or plan.gradient_accumulation_steps != 1:
        # only when asked for, as Accelerate: a default 1 would read as an explicit DeepSpeed
        # value and contradict Accelerator(gradient_accumulation_steps=...) in the script
        values["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(plan.gradient_accumulation_steps)
    if plan.enable_cpu_affinity:
        values["ACCELERATE_CPU_AFFINITY"] = "1"
    if plan.downcast_bf16:
        values["ACCELERATE_DOWNCAST_BF16"] = "true"
    threads = _default_threads(plan, current)
    if threads is not None:
        values["OMP_NUM_THREADS"] = str(threads)
    if plan.gpu_ids != "all":
        values["CUDA_VISIBLE_DEVICES"] = plan.gpu_ids
    if plan.use_cpu:
        # Intel OpenMP's thread pinning for CPU training, as Accelerate's launcher sets it
        # (libgomp ignores them); values already in the environment are the user's and stay
        for name, value in _KMP_CPU.items():
            if name not in current:
                values[name] = value
    values.update(dict(plan.extra_env))
    return values


def apply_worker_env(values: Mapping[str, str]) -> None:
    """Write `values` into this process's environment, which the workers inherit."""
    for name, value in values.items():
        envvars.write(name, value)

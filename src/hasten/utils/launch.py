"""Compatibility path for ``accelerate.utils.launch``; the launch engine lives in `hasten.launchers`.

hasten builds a `LaunchPlan` (flags > environment > config file > defaults) and turns it into
the workers' ``ACCELERATE_*`` environment; Accelerate's argparse-based ``prepare_*`` helpers
return what ``hasten launch`` itself uses (`hasten.commands.launch`), TPU and SageMaker
preparation live in `hasten.launchers.xla` and `hasten.launchers.sagemaker`.
"""

from hasten.commands.launch import (
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
)
from hasten.launchers import debug_launcher, notebook_launcher
from hasten.launchers.elastic import launch_config, script_command, worker_command
from hasten.launchers.env import apply_worker_env, setup_fp8_env, worker_env
from hasten.launchers.install import install_xla
from hasten.launchers.options import prepare_extend_env_parallelism_config
from hasten.launchers.plan import LaunchPlan, build_plan, resolve_settings
from hasten.launchers.prepare import PrepareForLaunch, env_var_path_add

# Accelerate's private name for convert_nargs_to_dict (its test_sagemaker imports it from here).
from hasten.launchers.sagemaker import (  # noqa: F401 - a private name, not in __all__
    convert_nargs_to_dict as _convert_nargs_to_dict,
)
from hasten.launchers.sagemaker import prepare_sagemager_args_inputs
from hasten.launchers.slurm import expand_nodelist, slurm_topology
from hasten.launchers.xla import prepare_tpu

__all__ = [
    "LaunchPlan",
    "PrepareForLaunch",
    "apply_worker_env",
    "build_plan",
    "debug_launcher",
    "env_var_path_add",
    "expand_nodelist",
    "install_xla",
    "launch_config",
    "notebook_launcher",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "resolve_settings",
    "script_command",
    "setup_fp8_env",
    "slurm_topology",
    "worker_command",
    "worker_env",
]

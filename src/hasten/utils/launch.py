"""Compatibility path for ``accelerate.utils.launch``; the launch engine lives in `hasten.launchers`.

hasten builds a `LaunchPlan` (flags > environment > config file > defaults) and turns it into
the workers' ``ACCELERATE_*`` environment; Accelerate's argparse-based ``prepare_*_env`` helpers
map onto `build_plan` + `worker_env`.
"""

from hasten.launchers import debug_launcher, notebook_launcher
from hasten.launchers.elastic import launch_config, script_command, worker_command
from hasten.launchers.env import apply_worker_env, setup_fp8_env, worker_env
from hasten.launchers.install import install_xla
from hasten.launchers.plan import LaunchPlan, build_plan, resolve_settings
from hasten.launchers.slurm import expand_nodelist, slurm_topology

__all__ = [
    "LaunchPlan",
    "apply_worker_env",
    "build_plan",
    "debug_launcher",
    "expand_nodelist",
    "install_xla",
    "launch_config",
    "notebook_launcher",
    "resolve_settings",
    "script_command",
    "setup_fp8_env",
    "slurm_topology",
    "worker_command",
    "worker_env",
]

"""Multi-node DeepSpeed launches through DeepSpeed's own runner (pdsh, openmpi, mvapich, ...).

On one machine, and with ``--deepspeed_multinode_launcher standard``, hasten starts the workers
itself (torch elastic) with the ``ACCELERATE_DEEPSPEED_*`` variables. Other multi-node launchers
reach the remote hosts through the ``deepspeed`` runner; `deepspeed_runner_command` builds the
command that runner takes, and `write_deepspeed_env` the ``.deepspeed_env`` file it exports to
every host.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from hasten.core.constants import DEEPSPEED_MULTINODE_LAUNCHERS
from hasten.launchers.plan import LaunchPlan

__all__ = [
    "add_deepspeed_launcher_flags",
    "deepspeed_runner_command",
    "uses_deepspeed_runner",
    "write_deepspeed_env",
]


def add_deepspeed_launcher_flags(parser: argparse.ArgumentParser) -> None:
    """The multi-node flags of DeepSpeed's runner (not worker settings)."""
    group = parser.add_argument_group("DeepSpeed multi-node launch")
    group.add_argument("--deepspeed_hostfile", help="Hostfile of the machines (runner format).")
    group.add_argument("--deepspeed_exclusion_filter", help="Hosts/slots to leave out.")
    group.add_argument("--deepspeed_inclusion_filter", help="Only these hosts/slots.")
    group.add_argument(
        "--deepspeed_multinode_launcher",
        choices=DEEPSPEED_MULTINODE_LAUNCHERS,
        help="How DeepSpeed reaches the other machines (standard: hasten's own launcher).",
    )


def uses_deepspeed_runner(plan: LaunchPlan, launcher: str | None) -> bool:
    """Whether this launch goes through DeepSpeed's runner (several machines, not standard)."""
    return plan.num_machines > 1 and (launcher or "pdsh") != "standard"


def deepspeed_runner_command(
    plan: LaunchPlan,
    *,
    launcher: str | None,
    hostfile: str | None,
    exclusion_filter: str | None = None,
    inclusion_filter: str | None = None,
) -> list[str]:
    """The ``deepspeed`` runner command that starts ``plan`` on every machine.

    Raises:
        ValueError: no hostfile, or both an inclusion and an exclusion filter.
    """
    launcher = launcher or "pdsh"
    if hostfile is None:
        raise ValueError(
            f"--deepspeed_multinode_launcher {launcher} starts the job on the hosts of a "
            "hostfile; pass --deepspeed_hostfile PATH (lines like 'worker-1 slots=8')."
        )
    if exclusion_filter is not None and inclusion_filter is not None:
        raise ValueError(
            "--deepspeed_exclusion_filter and --deepspeed_inclusion_filter were both given; "
            "DeepSpeed's runner takes one of them."
        )
    cmd = ["deepspeed", "--hostfile", str(hostfile)]
    if launcher == "nossh":
        cmd += ["--node_rank", str(plan.machine_rank), "--no_ssh"]
    else:
        cmd += ["--no_local_rank", "--launcher", launcher]
    if exclusion_filter is not None:
        cmd += ["--exclude", exclusion_filter]
    elif inclusion_filter is not None:
        cmd += ["--include", inclusion_filter]
    else:
        cmd += ["--num_gpus", str(plan.num_processes // plan.num_machines)]
    cmd += [
        "--master_addr",
        str(plan.main_process_ip),
        "--master_port",
        str(plan.main_process_port),
    ]
    if plan.module:
        cmd.append("--module")
    elif plan.no_python:
        cmd.append("--no_python")
    return [*cmd, plan.script, *plan.script_args]


def write_deepspeed_env(env: Mapping[str, str], names: Sequence[str], folder: Path) -> Path:
    """Append ``names`` from ``env`` to ``folder/.deepspeed_env`` (the runner exports them).

    Raises:
        ValueError: a value holds a newline, which the file format cannot carry.
    """
    path = folder / ".deepspeed_env"
    lines = []
    for name in names:
        value = env[name]
        if "\n" in value:
            raise ValueError(f"{name}={value!r} holds a newline; .deepspeed_env cannot carry it")
        lines.append(f"{name}={value}\n")
    with open(path, "a", encoding="utf-8") as handle:
        handle.writelines(lines)
    return path

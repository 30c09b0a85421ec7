"""TPU pods: run a command on every TPU VM worker with ``gcloud compute tpus tpu-vm ssh``.

`hasten launch --tpu --tpu_cluster` on one machine runs the same ``hasten launch`` on every
worker of the pod, and ``hasten tpu-config`` runs setup commands there; both build the command
here (tests build it and never run it). No torch import: this runs on the launching machine.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["gcloud_ssh_command", "pod_launch_command"]


def gcloud_ssh_command(
    tpu_name: str, tpu_zone: str, command: str, use_alpha: bool = False, worker: str = "all"
) -> list[str]:
    """Return ``gcloud [alpha] compute tpus tpu-vm ssh NAME --zone ZONE --command CMD --worker W``.

    Raises:
        ValueError: `tpu_name` or `tpu_zone` is empty.
    """
    if not tpu_name or not tpu_zone:
        raise ValueError(
            f"A TPU pod command needs the TPU's name and zone, got tpu_name={tpu_name!r}, "
            f"tpu_zone={tpu_zone!r}. Pass --tpu_name and --tpu_zone (or set tpu_name/tpu_zone "
            "in the config file)."
        )
    head = ["gcloud", *(["alpha"] if use_alpha else [])]
    return [
        *head,
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        tpu_name,
        "--zone",
        tpu_zone,
        "--command",
        command,
        "--worker",
        worker,
    ]


def pod_launch_command(
    args: argparse.Namespace, env: Mapping[str, str], launcher: Sequence[str] = ("hasten", "launch")
) -> list[str]:
    """Return the ``gcloud`` command that runs this launch on every worker of a TPU pod.

    Each worker runs ``[sudo] env K=V... hasten launch --tpu --no_tpu_cluster --num_machines 1
    --num_processes N --main_training_function F script args`` in the current directory, with
    ``ACCELERATE_IN_TPU_POD=1``; mixed precision and compile settings travel as variables.
    """
    variables = {**env, "ACCELERATE_IN_TPU_POD": "1"}
    for pair in getattr(args, "env", None) or []:
        key, value = pair if isinstance(pair, tuple) else str(pair).split("=", 1)
        variables[key] = value
    inner = [
        *launcher,
        "--tpu",
        "--no_tpu_cluster",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--num_processes",
        str(getattr(args, "num_processes", None) or 1),
        "--main_training_function",
        str(getattr(args, "main_training_function", None) or "main"),
        *(["--module"] if getattr(args, "module", False) else []),
        args.training_script,
        *getattr(args, "training_script_args", []),
    ]
    prefix = ["sudo"] if getattr(args, "tpu_use_sudo", False) else []
    assignments = [f"{key}={value}" for key, value in variables.items()]
    remote = [*prefix, "env", *assignments, *inner]
    command = f"cd {shlex.quote(str(Path.cwd()))}; {shlex.join(remote)}"
    vm = getattr(args, "vm", None) or getattr(args, "tpu_vm", None)
    worker = ",".join(vm) if vm else "all"
    return gcloud_ssh_command(
        str(getattr(args, "tpu_name", "") or ""),
        str(getattr(args, "tpu_zone", "") or ""),
        command,
        worker=worker,
    )

"""Launching on one TPU host: the XLA variables, then torch_xla's spawn over its cores.

Pods (several TPU VMs) go through ``gcloud`` ssh instead: see `hasten.launchers.xla_pod`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hasten.core.environment import patch_environment
from hasten.core.imports import require
from hasten.launchers.prepare import PrepareForLaunch
from hasten.platforms.checks import is_torch_xla_available

__all__ = ["load_training_function", "prepare_tpu", "run_on_tpu_host"]


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """Add the XLA variables a TPU launch needs to `current_env`; for a pod, alias the pod args.

    bf16 on a TPU sets ``XLA_USE_BF16=1`` (or ``XLA_DOWNCAST_BF16=1`` with ``downcast_bf16``);
    ``debug`` sets ``ACCELERATE_DEBUG_MODE``. With `pod`, ``args.vm`` and ``args.tpu`` take the
    values of ``args.tpu_vm`` and ``args.tpu_name`` (the pod launcher's names).
    """
    if getattr(args, "mixed_precision", None) == "bf16" and is_torch_xla_available(
        check_is_tpu=True
    ):
        name = "XLA_DOWNCAST_BF16" if getattr(args, "downcast_bf16", False) else "XLA_USE_BF16"
        current_env[name] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = getattr(args, "tpu_vm", None)
        args.tpu = getattr(args, "tpu_name", None)
    return args, current_env


def load_training_function(script: str, function: str, module: bool = False) -> Callable[..., Any]:
    """Import `script` (a file, or a module with `module`) and return its `function`.

    Raises:
        ValueError: the script has no such function.
    """
    if module:
        name = script
    else:
        path = Path(script).resolve()
        sys.path.append(str(path.parent))
        name = path.stem
    loaded = importlib.import_module(name)
    target = getattr(loaded, function, None)
    if not callable(target):
        raise ValueError(
            f"{script!r} has no function {function!r} to start on the TPU cores. Define it, or "
            "name yours with --main_training_function."
        )
    return target


def run_on_tpu_host(
    function: Callable[..., Any], num_processes: int | None, env: Mapping[str, str]
) -> None:
    """Start `function` on this TPU host's cores with torch_xla's multiprocessing spawn.

    Under PJRT torch_xla starts one process per device (``nprocs=None``) or exactly one.
    """
    # optional: torch_xla
    require("torch_xla", feature="hasten launch --tpu", extra="xla")
    xmp = importlib.import_module("torch_xla.distributed.xla_multiprocessing")
    nprocs = 1 if num_processes == 1 else None
    with patch_environment(**env):
        xmp.spawn(PrepareForLaunch(function), args=(), nprocs=nprocs)

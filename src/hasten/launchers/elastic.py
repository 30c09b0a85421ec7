"""Run a `LaunchPlan`: directly for one process, through torch elastic for several.

One process on one machine needs no rendezvous (unless FSDP needs its process group), so the
launcher replaces itself with the script (``exec``): no extra process, no torch import in the
launcher, exit code and signals pass straight through. Otherwise PyTorch's own elastic agent (``elastic_launch``, what
``torchrun`` uses) starts the workers, watches them, stops them all when one fails, and
restarts the group up to ``max_restarts`` times.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from hasten.config import envvars
from hasten.launchers.env import apply_worker_env
from hasten.launchers.plan import LaunchPlan
from hasten.launchers.rendezvous import fresh_worker_store, rdzv_configs

__all__ = [
    "choose_port",
    "format_failures",
    "launch_config",
    "run",
    "run_workers",
    "script_command",
    "single_machine_port",
    "worker_command",
]


def script_command(plan: LaunchPlan) -> list[str]:
    """Return the command that runs the script once, as ``python [-m] script args``."""
    if plan.no_python:
        return [plan.script, *plan.script_args]
    return [sys.executable, *(["-m"] if plan.module else []), plan.script, *plan.script_args]


def worker_command(plan: LaunchPlan) -> tuple[str, list[str]]:
    """Return (executable, arguments) for each elastic worker.

    Python scripts go through `hasten.launchers.bootstrap`, which records a crash's traceback
    for the launcher's report; ``--no_python`` executables run as given.
    """
    if plan.no_python:
        return plan.script, list(plan.script_args)
    head = ["-u", "-m", "hasten.launchers.bootstrap", *(["-m"] if plan.module else [])]
    return sys.executable, [*head, plan.script, *plan.script_args]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("" if host not in ("127.0.0.1", "localhost") else host, port))
        except OSError:
            return True
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def single_machine_port(host: str, port: int) -> int:
    """`port` for a rendezvous on this machine only, or a free one when it is taken (or 0)."""
    if port == 0 or _port_in_use(host, port):
        return _free_port()
    return port


def choose_port(plan: LaunchPlan) -> int:
    """Return the rendezvous port: the plan's, or a free one on a single machine when taken."""
    port = plan.main_process_port
    if plan.num_machines == 1:
        return single_machine_port(plan.main_process_ip, port)
    static_host = plan.machine_rank == 0 and plan.rdzv_backend == "static"
    if static_host and (port == 0 or _port_in_use(plan.main_process_ip, port)):
        raise RuntimeError(
            f"main_process_port {port} on machine 0 is already in use (or 0, which cannot be "
            "shared with the other machines). Pass a free --main_process_port to every machine."
        )
    return port


def launch_config(plan: LaunchPlan, port: int | None = None) -> Any:
    """Return the ``torch.distributed.launcher.api.LaunchConfig`` for `plan`."""
    from torch.distributed.launcher.api import LaunchConfig  # deferred: imports all of torch

    port = plan.main_process_port if port is None else port
    rdzv = rdzv_configs(plan.rdzv_backend, plan.machine_rank, plan.is_elastic, dict(plan.rdzv_conf))
    local = plan.main_process_ip in ("127.0.0.1", "localhost", "::1")
    return LaunchConfig(
        min_nodes=plan.min_nodes,
        max_nodes=plan.num_machines,
        nproc_per_node=plan.nproc_per_node,
        run_id=plan.rdzv_id,
        rdzv_endpoint=f"{plan.main_process_ip}:{port}",
        rdzv_backend=plan.rdzv_backend,
        rdzv_configs=rdzv,
        max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval,
        start_method="spawn",
        # All machines on loopback: advertise loopback, not this host's (maybe unroutable) FQDN.
        local_addr=plan.main_process_ip if local else None,
    )


def _traceback_of(failure: Any) -> str:
    data = getattr(failure, "error_file_data", None) or {}
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        return str(message.get("extraInfo", {}).get("py_callstack") or message.get("message"))
    return str(getattr(failure, "message", "") or "(no traceback recorded)")


def _exit_code(code: int) -> int:
    """Map a worker's exit status to ours: its code, or 128+N when killed by signal N."""
    return 128 - code if code < 0 else (code or 1)


def format_failures(failures: Mapping[int, Any]) -> tuple[str, int]:
    """Describe failed workers (global rank -> torch ``ProcessFailure``); return (text, exit code).

    The exit code is that of the first worker to fail (the root cause).
    """
    # Workers the agent stopped with a signal are consequences; a worker that exited with an
    # error code is the cause, so it comes first.
    ordered = sorted(
        failures.items(),
        key=lambda item: (int(item[1].exitcode) < 0, item[1].timestamp, item[0]),
    )
    lines = ["hasten launch: a worker failed; all workers were stopped."]
    for rank, failure in ordered:
        code = int(failure.exitcode)
        how = f"stopped by signal {-code}" if code < 0 else f"exited with code {code}"
        lines.append(
            f"--- rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) {how} ---"
        )
        if code >= 0:
            lines.append(_traceback_of(failure).rstrip())
    first = ordered[0][1] if ordered else None
    return "\n".join(lines), _exit_code(int(first.exitcode)) if first else 1


def run_workers(plan: LaunchPlan, env: Mapping[str, str]) -> int:
    """Start the plan's workers under torch's elastic agent (even one); return the exit code."""
    # deferred: these import all of torch, which a single-process launch never needs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    apply_worker_env(env)
    fresh_worker_store(plan.rdzv_backend)
    entrypoint, args = worker_command(plan)
    # torch's static rendezvous keeps one store across its own restarts, so a restarted group
    # can read the previous attempt's gloo/nccl addresses and fail to connect (or hang). On
    # one machine hasten restarts the group itself, each attempt on a fresh store and port.
    attempts = plan.max_restarts + 1 if plan.num_machines == 1 else 1
    for attempt in range(attempts):
        config = launch_config(plan, choose_port(plan) if attempt == 0 else _free_port())
        if attempts > 1:
            config.max_restarts = 0
            # Each attempt's agent counts from 0; the bootstrap turns this into the worker's
            # TORCHELASTIC_RESTART_COUNT so scripts still see which attempt they are.
            envvars.write("HASTEN_RESTART_COUNT", attempt)
        try:
            elastic_launch(config, entrypoint)(*args)
        except ChildFailedError as err:
            text, code = format_failures(err.failures)
            print(text, file=sys.stderr, flush=True)
            if attempt + 1 < attempts:
                print(
                    f"hasten launch: restarting the workers ({attempt + 1} of "
                    f"{plan.max_restarts} restarts).",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            return code
        except SignalException as err:
            # The launcher itself was told to stop (Ctrl-C, scheduler preemption): workers
            # are already stopped by the agent; exit like a process killed by that signal.
            print(f"hasten launch: received {err.sigval.name}; workers stopped.", file=sys.stderr)
            return 128 + int(err.sigval)
        except RendezvousError as err:
            print(
                f"hasten launch: rendezvous at {plan.rdzv_endpoint} failed ({err}). Check that "
                "every machine uses the same --main_process_ip/--main_process_port and "
                "--num_machines, and that machine 0 is reachable.",
                file=sys.stderr,
            )
            return 1
        return 0
    return 1  # not reached: the last attempt returns


def _needs_process_group(plan: LaunchPlan, env: Mapping[str, str]) -> bool:
    """Whether even one process must join a (one-process) group: FSDP off the CPU.

    FSDP shards over a process group; Accelerate's launcher starts ``--use_fsdp`` jobs through
    torchrun for that reason, so one GPU can still train under FSDP (e.g. with CPU offload). A
    script started directly would run without the group and leave the plugin unused.
    """
    return not plan.use_cpu and bool(envvars.setting("ACCELERATE_USE_FSDP", env))


def run(plan: LaunchPlan, env: Mapping[str, str], *, replace_process: bool = True) -> int:
    """Run `plan` with the worker variables `env`; return the exit code for ``hasten launch``.

    Args:
        plan: what to run and where.
        env: variables added to every worker's environment (`worker_env`).
        replace_process: for a single process, replace this process with the script (the
            launcher's fastest path; does not return). When False, run it as a child instead.
    """
    if not plan.is_single_process or _needs_process_group(plan, env):
        return run_workers(plan, env)
    command = script_command(plan)
    full_env = {**envvars.snapshot(), **env}
    sys.stdout.flush()
    sys.stderr.flush()
    if replace_process and sys.platform != "win32":
        os.execvpe(command[0], command, full_env)
    return subprocess.run(command, env=full_env, check=False).returncode

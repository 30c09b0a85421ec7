"""Start a training function on several processes from plain Python or a notebook.

`notebook_launcher` runs the function under PyTorch's elastic agent (forked workers, so the
function need not be importable); `debug_launcher` forks CPU workers joined by gloo for quick
multi-process checks. Both reset hasten's state in each worker, which must create its own
`Accelerator`/`PartialState`.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import Any

from hasten.config import envvars
from hasten.config.enums import parse_mixed_precision
from hasten.core.environment import are_libraries_initialized, patch_environment

__all__ = ["debug_launcher", "notebook_launcher"]


class _Worker:
    """Picklable wrapper run in each worker: fresh hasten state, then the user's function."""

    def __init__(self, function: Callable[..., Any], set_ranks: bool, world_size: int) -> None:
        self.function = function
        self.set_ranks = set_ranks
        self.world_size = world_size
        # torch elastic names the job after its entrypoint's __name__.
        self.__name__ = getattr(function, "__name__", type(function).__name__)
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)

    def __call__(self, *args: Any) -> Any:
        if self.set_ranks:
            # start_processes passes the process index first; publish it like torchrun would
            # (one debug process publishes none: it is a plain single process, as in Accelerate).
            index, args = args[0], args[1:]
            if self.world_size > 1:
                for name in ("RANK", "LOCAL_RANK"):
                    envvars.write(name, index)
                envvars.write("WORLD_SIZE", self.world_size)
                envvars.write("LOCAL_WORLD_SIZE", self.world_size)
        _reset_hasten_state()
        return self.function(*args)


def _reset_hasten_state() -> None:
    try:
        from hasten.state._shared import reset_state
    except ImportError:  # state layer absent: nothing to reset
        return
    reset_state()


def _state_in_use() -> bool:
    """True when this process already built a PartialState or an Accelerator."""
    try:
        from hasten.state import PartialState, is_initialized
    except ImportError:  # state layer absent: nothing can be in use
        return False
    return bool(PartialState._shared_state) or bool(is_initialized())


def _free_port() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _check_can_fork(device_type: str) -> None:
    """Refuse to fork when the parent already holds an accelerator context or hasten state."""
    import torch  # deferred: the launcher module stays cheap to import

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was already initialised in this process, so forked workers cannot use it. "
            "Restart the notebook/interpreter and make sure no cell touches CUDA (no .cuda(), "
            "no torch.cuda calls, no Accelerator) before notebook_launcher; do that work "
            "inside the launched function instead."
        )
    if _state_in_use():
        raise RuntimeError(
            "An Accelerator/PartialState already exists in this process. Create it only "
            "inside the function given to notebook_launcher, then restart and relaunch."
        )
    accelerated = torch.cuda.is_available() or device_type == "xpu"
    early = are_libraries_initialized("bitsandbytes") if accelerated else []
    if early:
        # bitsandbytes sets up the device when imported, which forked workers cannot share
        # (on a CPU-only machine it sets up nothing, so the launch goes ahead there)
        listed = "".join(f"\n\t* `{name}`" for name in early)
        raise RuntimeError(
            "Could not start distributed process. Libraries known to initialize device upon "
            "import have been imported already. Please keep these imports inside your training "
            f"function to try and help with this:{listed}\n(hasten: restart the notebook and "
            "import them in the launched function.)"
        )


def _checked_precision(mixed_precision: str) -> str:
    return parse_mixed_precision(mixed_precision, "notebook_launcher(mixed_precision=...)")


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run ``function(*args)`` on `num_processes` processes per node (fork, elastic agent).

    Create the `Accelerator` inside `function`, never before the call: the workers are forked
    from this process. With ``num_processes=1`` the function runs here, in this process.

    Raises:
        ValueError: `num_processes` missing or < 1, `node_rank` >= `num_nodes`, or unknown
            `mixed_precision`.
        RuntimeError: CUDA or hasten state was initialised before the call, or a worker failed
            (the message holds each failed rank's traceback).
    """
    precision = _checked_precision(mixed_precision)
    if num_processes is None or num_processes < 1:
        raise ValueError(
            f"num_processes={num_processes!r}: pass the number of processes to start on this "
            "node, e.g. notebook_launcher(train, num_processes=2)."
        )
    if not 0 <= node_rank < num_nodes:
        raise ValueError(f"node_rank={node_rank!r} must be in [0, num_nodes={num_nodes}).")
    if num_processes == 1 and num_nodes == 1:
        with patch_environment(accelerate_mixed_precision=precision):
            function(*args)
        return
    if num_nodes == 1 and not rdzv_endpoint:
        # as `hasten launch`: on one machine a port another job holds is swapped for a free one
        from hasten.launchers.elastic import single_machine_port

        use_port = str(single_machine_port(master_addr, int(use_port)))
    _launch_elastic(
        _Worker(function, set_ranks=False, world_size=num_processes * num_nodes),
        args,
        {
            "min_nodes": num_nodes,
            "max_nodes": num_nodes,
            "nproc_per_node": num_processes,
            "run_id": rdzv_id,
            "rdzv_endpoint": rdzv_endpoint or f"{master_addr}:{use_port}",
            "rdzv_backend": rdzv_backend,
            "rdzv_configs": dict(
                rdzv_conf or {}, **({"rank": node_rank} if rdzv_backend == "static" else {})
            ),
            "max_restarts": max_restarts,
            "monitor_interval": monitor_interval,
            "log_line_prefix_template": log_line_prefix_template,
        },
        precision,
    )


def _launch_elastic(
    worker: _Worker, args: tuple[Any, ...], config_kwargs: dict[str, Any], precision: str
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from hasten.launchers.elastic import format_failures

    xpu = _has_xpu()
    _check_can_fork("xpu" if xpu else "cuda")
    config = LaunchConfig(start_method="spawn" if xpu else "fork", **config_kwargs)
    with patch_environment(accelerate_mixed_precision=precision):
        try:
            elastic_launch(config, worker)(*args)
        except ChildFailedError as err:
            text, _ = format_failures(err.failures)
            raise _worker_failed(err, text) from err


def _worker_failed(err: Any, report: str) -> Exception:
    """torch's `ChildFailedError` (what Accelerate's launcher raises, and its tests catch) that
    is a `RuntimeError` too and reads as hasten's per-rank report."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    class WorkerFailedError(ChildFailedError, RuntimeError):
        def __str__(self) -> str:
            return report

    return WorkerFailedError(err.name, err.failures)


def _has_xpu() -> bool:
    import torch  # deferred: the launcher module stays cheap to import

    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def debug_launcher(
    function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2
) -> None:
    """Run ``function(*args)`` on `num_processes` forked CPU processes joined by gloo.

    For tests and debugging only: everything runs on CPU on this machine. With one process
    there is no process group: a plain single process, as in Accelerate.

    Raises:
        ValueError: `num_processes` < 1.
        torch.multiprocessing.ProcessRaisedException: a worker raised (with its traceback).
    """
    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be >= 1.")
    from torch.multiprocessing import start_processes  # deferred: imports all of torch

    # One process runs without a process group: a plain single process, as Accelerate's.
    group = (
        {"world_size": str(num_processes), "master_addr": "127.0.0.1", "master_port": _free_port()}
        if num_processes > 1
        else {}
    )
    with patch_environment(**group, accelerate_mixed_precision="no", accelerate_use_cpu="yes"):
        worker = _Worker(function, set_ranks=True, world_size=num_processes)
        start_processes(worker, args=args, nprocs=num_processes, start_method="fork")
    sys.stdout.flush()

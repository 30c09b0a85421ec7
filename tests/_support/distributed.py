"""Run a function on N forked CPU processes joined by gloo on loopback, with a hard timeout.

Forking costs ~0.1 s for 2 workers here (spawning re-imports torch in each child, ~7 s), so
every multi-process unit test goes through `run_distributed`. Each worker's traceback comes
back labelled with its rank; a worker that hangs past the timeout fails the test instead of
eating CI.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["DistributedTestError", "free_port", "run_distributed"]


class DistributedTestError(AssertionError):
    """One or more workers failed or timed out; the message holds each rank's story."""


def free_port() -> int:
    """Return a TCP port on loopback that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(
    rank: int,
    world_size: int,
    port: int,
    env: dict[str, str],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    queue: Any,
    release: Any,
) -> None:
    # The child's full collections would scan (and so copy-on-write) every object the test
    # process holds (torch, transformers...): keep what it inherited out of the collector's reach.
    gc.freeze()
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            # PartialState leaves the thread count alone when this is set: raising it in a
            # fork (a one-process world gets every core) hangs on the parent's OpenMP pool.
            "OMP_NUM_THREADS": "1",
        }
    )
    os.environ.update(env)
    torch_module = sys.modules.get("torch")
    if torch_module is not None:
        # The parent's OpenMP pool does not survive the fork: a parallel op before hasten's
        # PartialState sets the thread count can hang on it. One thread per worker (2 on 2 cores).
        torch_module.set_num_threads(1)
    try:
        # A forked child inherits the parent's singletons; start from a clean slate.
        from hasten.state._shared import reset_state

        reset_state()
    except ImportError:
        pass
    try:
        result = fn(*args)
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        # Rank 0 hosts the store: a rank that finishes first must not take it away while a
        # slower rank still rendezvouses on it (a subgroup's gloo connect reads "Connection reset
        # by peer"). Every worker stays until the parent has heard from all of them.
        release.wait(timeout=60.0)
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                # hasten's teardown: a plain destroy can deadlock on gloo (state/teardown.py)
                from hasten.state.teardown import destroy_group

                destroy_group()
        except Exception:  # noqa: BLE001 - teardown best effort; the result is already sent
            pass


def run_distributed(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` forked processes and return their results by rank.

    ``fn`` must be importable or a closure (fork shares the parent's memory, nothing is pickled
    on the way in); its return value must be picklable. Raises `DistributedTestError` naming
    every rank that failed, with its traceback, or the ranks still running at the timeout.
    """
    # FSDP2's first fully_shard (DTensor.from_local) imports torch._dynamo: ~4 s in every forked
    # worker unless the parent has it already, and each fork inherits it for free.
    import torch._dynamo  # noqa: F401

    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    release = ctx.Event()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, dict(env or {}), fn, args, queue, release),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    import time

    deadline = time.monotonic() + timeout
    while len(results) + len(errors) < world_size and time.monotonic() < deadline:
        if queue.empty():
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
            time.sleep(0.01)
            continue
        rank, status, payload = queue.get()
        (results if status == "ok" else errors)[rank] = payload
    release.set()
    for proc in procs:
        proc.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    missing = [r for r in range(world_size) if r not in results and r not in errors]
    if errors or missing:
        parts = [f"--- rank {r} failed ---\n{tb}" for r, tb in sorted(errors.items())]
        parts += [
            f"--- rank {r} did not finish within {timeout}s (exit code {procs[r].exitcode}) ---"
            for r in missing
        ]
        raise DistributedTestError("\n".join(parts))
    return [results[r] for r in range(world_size)]

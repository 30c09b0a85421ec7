"""gather / reduce / broadcast of a nested dict of 10 tensors x 1000 floats on 2 gloo processes.

Runs the same work three ways and prints time per call and the ratio to raw torch.distributed:

- raw: what a careful hand-written loop does (all_gather per tensor + cat, clone + all_reduce per
  tensor + divide, broadcast per tensor);
- hasten: ``hasten.ops.collectives`` (coalesces same-dtype tensors into one collective);
- accelerate: ``accelerate.utils`` (only if it is importable).

Implementations are interleaved round by round and the median round is reported, since the
machine is shared. Also prints the cost of `hasten.state.recorder.guarded` alone.

Usage: python benchmarks/bench_collectives.py [--iters 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from _reference import require_real_accelerate

NUM_TENSORS = 10
NUMEL = 1000


def _data(rank: int) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.full((NUMEL,), float(rank + i)) for i in range(NUM_TENSORS)}


def _raw_ops(world: int) -> dict[str, Callable[[Any], Any]]:
    def gather(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for key, tensor in data.items():
            parts = [torch.empty_like(tensor) for _ in range(world)]
            dist.all_gather(parts, tensor)
            out[key] = torch.cat(parts)
        return out

    def reduce(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for key, tensor in data.items():
            copy = tensor.clone()
            dist.all_reduce(copy)
            copy /= world
            out[key] = copy
        return out

    def broadcast(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for tensor in data.values():
            dist.broadcast(tensor, src=0)
        return data

    return {"gather": gather, "reduce": reduce, "broadcast": broadcast}


def _hasten_ops() -> dict[str, Callable[[Any], Any]]:
    from hasten.ops.collectives import broadcast, gather, reduce

    return {"gather": gather, "reduce": reduce, "broadcast": broadcast}


def _accelerate_ops() -> dict[str, Callable[[Any], Any]] | None:
    try:
        require_real_accelerate()
        from accelerate import PartialState as AccPartialState
        from accelerate.utils import broadcast, gather, reduce
    except Exception:  # noqa: BLE001 - accelerate is optional here
        return None
    AccPartialState(cpu=True)
    return {"gather": gather, "reduce": reduce, "broadcast": broadcast}


def _check_same(ops: dict[str, dict[str, Callable[[Any], Any]]], rank: int) -> None:
    """Every implementation must produce the same values before we time anything."""
    for op in ("gather", "reduce", "broadcast"):
        results = {name: impls[op](_data(rank)) for name, impls in ops.items()}
        reference = results["raw"]
        for name, result in results.items():
            for key in reference:
                if not torch.equal(result[key], reference[key]):
                    raise AssertionError(f"{name} {op} differs from raw on {key}")


def _time(fn: Callable[[Any], Any], data: Any, iters: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn(data)
    dist.barrier()
    return (time.perf_counter() - start) / iters


def _single_tensor_ops() -> dict[str, Callable[[Any], Any]]:
    from hasten.ops.collectives import gather

    def raw(tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor)
        return torch.cat(parts)

    return {"raw": raw, "hasten": gather}


def _worker(rank: int, port: int, iters: int, rounds: int, queue: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    from hasten.state import PartialState

    PartialState(cpu=True)  # joins the gloo group
    ops: dict[str, dict[str, Callable[[Any], Any]]] = {"raw": _raw_ops(2), "hasten": _hasten_ops()}
    accelerate = _accelerate_ops()
    if accelerate is not None:
        ops["accelerate"] = accelerate
    _check_same(ops, rank)
    cases = [
        (op, name, impls[op], _data(rank))
        for op in ("gather", "reduce", "broadcast")
        for name, impls in ops.items()
    ]
    cases += [
        ("gather 1 tensor", name, fn, torch.ones(NUMEL))
        for name, fn in _single_tensor_ops().items()
    ]
    samples: dict[tuple[str, str], list[float]] = {(op, name): [] for op, name, _, _ in cases}
    for fn_case in cases:  # warm-up
        _time(fn_case[2], fn_case[3], max(5, iters // 10))
    for _ in range(rounds):
        for op, name, fn, data in cases:
            samples[(op, name)].append(_time(fn, data, iters))
    if rank == 0:
        queue.put({key: statistics.median(values) for key, values in samples.items()})
    dist.destroy_process_group()


def _guard_cost() -> float:
    from hasten.state.recorder import guarded

    def noop() -> None:
        return None

    n = 200_000
    start = time.perf_counter()
    for _ in range(n):
        guarded("gather", noop)
    guarded_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(n):
        noop()
    plain_s = time.perf_counter() - start
    return (guarded_s - plain_s) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    procs = [
        ctx.Process(target=_worker, args=(r, port, args.iters, args.rounds, queue))
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    if any(proc.exitcode != 0 for proc in procs) or queue.empty():
        sys.exit("benchmark workers failed")
    timings: dict[tuple[str, str], float] = queue.get()
    print(
        f"2 gloo processes, dict of {NUM_TENSORS} x {NUMEL} float32, median of {args.rounds} rounds x {args.iters} calls"
    )
    print(f"{'operation':<16} {'impl':<11} {'us/call':>9} {'vs raw':>8}")
    for op in ("gather", "reduce", "broadcast", "gather 1 tensor"):
        raw = timings[(op, "raw")]
        for (name_op, name), seconds in timings.items():
            if name_op == op:
                print(f"{op:<16} {name:<11} {seconds * 1e6:9.1f} {seconds / raw:7.2f}x")
    print(f"recorder.guarded overhead: {_guard_cost() * 1e9:.0f} ns per collective")


if __name__ == "__main__":
    main()

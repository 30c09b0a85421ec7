"""LocalSGD averaging and layerwise-casting forwards, each against its raw PyTorch equivalent.

- local_sgd: one parameter averaging of a 24-layer MLP (48 tensors) on 2 gloo processes:
  hasten's `LocalSGD` (one coalesced all-reduce) vs the raw loop Accelerate's LocalSGD does
  (``all_reduce`` + divide per parameter).
- casting: forward of a 24-layer MLP stored in bf16, computed in fp32: hasten's
  `attach_layerwise_casting_hooks` vs raw ``register_forward_pre_hook``/``register_forward_hook``
  pairs that call ``module.to`` (same work, plain torch hooks). Also prints parameter bytes.

Rounds are interleaved and the median is reported (the machine is shared).

Usage: python benchmarks/bench_features.py [--iters 50] [--rounds 5]
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
from torch import nn

LAYERS = 24
WIDTH = 256


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def _median_time(fn: Callable[[], Any], iters: int, rounds: int, barrier: bool = False) -> float:
    samples = []
    for _ in range(rounds):
        if barrier:
            dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if barrier:
            dist.barrier()
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples)


def _local_sgd_worker(rank: int, port: int, iters: int, rounds: int, queue: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    from hasten import Accelerator
    from hasten.local_sgd import LocalSGD

    acc = Accelerator(cpu=True)
    model = acc.prepare(_mlp())
    params = list(model.parameters())
    local_sgd = LocalSGD(acc, model, local_sgd_steps=1)

    def raw() -> None:
        with torch.no_grad():
            for p in params:
                dist.all_reduce(p.data)
                p.data /= 2

    def hasten_sync() -> None:
        local_sgd.step()

    timings: dict[str, list[float]] = {"raw": [], "hasten": []}
    for _ in range(rounds):
        timings["raw"].append(_median_time(raw, iters, 1, barrier=True))
        timings["hasten"].append(_median_time(hasten_sync, iters, 1, barrier=True))
    if rank == 0:
        queue.put({k: statistics.median(v) for k, v in timings.items()})
    dist.destroy_process_group()


def _bench_local_sgd(iters: int, rounds: int) -> dict[str, float]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    procs = [
        ctx.Process(target=_local_sgd_worker, args=(r, port, iters, rounds, queue))
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    if any(proc.exitcode != 0 for proc in procs) or queue.empty():
        sys.exit("local_sgd benchmark workers failed")
    return dict(queue.get())


def _raw_casting(model: nn.Module, storage: torch.dtype, compute: torch.dtype) -> None:
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.to(storage)
            module.register_forward_pre_hook(lambda m, a: m.to(compute) and None)
            module.register_forward_hook(lambda m, a, o: m.to(storage) and None)


def _bench_casting(iters: int, rounds: int) -> dict[str, float]:
    from hasten.big_modeling import attach_layerwise_casting_hooks

    torch.set_num_threads(1)
    x = torch.randn(8, WIDTH)
    raw, ours = _mlp(), _mlp()
    before = sum(p.numel() * p.element_size() for p in ours.parameters())
    _raw_casting(raw, torch.bfloat16, torch.float32)
    attach_layerwise_casting_hooks(ours, torch.bfloat16, torch.float32)
    after = sum(p.numel() * p.element_size() for p in ours.parameters())
    with torch.no_grad():
        torch.testing.assert_close(raw(x), ours(x))
        timings: dict[str, list[float]] = {"raw": [], "hasten": []}
        for _ in range(rounds):
            timings["raw"].append(_median_time(lambda: raw(x), iters, 1))
            timings["hasten"].append(_median_time(lambda: ours(x), iters, 1))
    result = {k: statistics.median(v) for k, v in timings.items()}
    result["bytes_before"], result["bytes_after"] = float(before), float(after)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sgd = _bench_local_sgd(args.iters, args.rounds)
    cast = _bench_casting(args.iters, args.rounds)
    print(f"{LAYERS} x Linear({WIDTH}, {WIDTH}), median of {args.rounds} rounds x {args.iters}")
    print(f"{'case':<26} {'impl':<8} {'us/call':>9} {'vs raw':>8}")
    for case, timings in (("local_sgd average (2 gloo)", sgd), ("bf16-stored fp32 forward", cast)):
        for name in ("raw", "hasten"):
            seconds = timings[name]
            print(f"{case:<26} {name:<8} {seconds * 1e6:9.1f} {seconds / timings['raw']:7.2f}x")
    print(
        f"parameter bytes: {cast['bytes_before'] / 1e6:.2f} MB fp32 -> "
        f"{cast['bytes_after'] / 1e6:.2f} MB stored in bf16"
    )


if __name__ == "__main__":
    main()

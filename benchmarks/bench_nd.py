"""2-D mesh step time beside DDP and FSDP2 on the same model: 4 processes, gloo, tiny sizes.

``python benchmarks/bench_nd.py [--steps N] [--width W] [--depth D]`` runs one torchrun job of 4
processes per layout (DDP, FSDP2 over 4, HSDP 2x2, FSDP2 x TP 2x2); each job times hasten's
training step on the same model and per-process batch, and the parent prints the median step of
each layout and its ratio to DDP. (On a 2-core machine 4 processes share the cores: the numbers
compare layouts, they are not a speed-up measurement.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _models import BlockModel

BATCH = 8
LAYOUTS = {
    "ddp": None,
    "fsdp2": {"dp_shard_size": 4},
    "hsdp 2x2": {"dp_replicate_size": 2, "dp_shard_size": 2},
    "fsdp2 x tp 2x2": {"dp_shard_size": 2, "tp_size": 2},
}


def worker(layout: str, steps: int, width: int, depth: int) -> None:
    torch.set_num_threads(1)
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.parallelism import ParallelismConfig

    sizes = LAYOUTS[layout]
    if sizes is None:
        accelerator = Accelerator(cpu=True)
    else:
        accelerator = Accelerator(
            cpu=True,
            parallelism_config=ParallelismConfig(**sizes),
            fsdp_plugin=FullyShardedDataParallelPlugin(
                fsdp_version=2, auto_wrap_policy="transformer_based_wrap"
            ),
        )
    torch.manual_seed(0)
    net = BlockModel(width, depth)
    model, opt = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-4))
    g = torch.Generator().manual_seed(accelerator.data_parallel_rank if sizes else 0)
    batches = [(torch.randn(BATCH, width, generator=g),) * 2 for _ in range(steps + 5)]
    times = []
    for i, (x, y) in enumerate(batches):
        dist.barrier()
        start = time.perf_counter()
        accelerator.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        dist.barrier()
        if i >= 5:
            times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"layout": layout, "median": statistics.median(times)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--layout", choices=list(LAYOUTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args.layout, args.steps, args.width, args.depth)
        dist.destroy_process_group()
        return
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    medians = {}
    for layout in LAYOUTS:
        cmd = [torchrun, "--nproc_per_node", "4", "--standalone", __file__, "--layout", layout]
        cmd += ["--steps", str(args.steps), "--width", str(args.width), "--depth", str(args.depth)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run(cmd, env=env, timeout=600, capture_output=True, text=True)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{layout} failed:\n{done.stdout}\n{done.stderr[-3000:]}")
        medians[layout] = json.loads(lines[-1].removeprefix("RESULT "))["median"]
    print(f"4-process step, {args.depth} blocks of width {args.width}, batch {BATCH}, gloo")
    for layout, median in medians.items():
        print(
            f"  {layout:<16} median {median * 1e3:8.2f} ms/step (ratio to ddp {median / medians['ddp']:.3f})"
        )


if __name__ == "__main__":
    main()

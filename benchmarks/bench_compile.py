"""Cold compile time of a model with repeated blocks: whole-model vs regional torch.compile.

Each measurement runs in a fresh child process (empty Dynamo/Inductor in-memory caches; the
on-disk Inductor cache is pointed at a fresh temporary directory) and times the first forward
+ backward after compiling through hasten's `Accelerator(dynamo_plugin=...)`.
Usage: ``python benchmarks/bench_compile.py [--blocks 12] [--backend inductor]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from _models import Tower


def child(regional: bool, blocks: int, backend: str) -> dict[str, float]:
    from hasten import Accelerator
    from hasten.utils import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend=backend, use_regional_compilation=regional)
    acc = Accelerator(cpu=True, dynamo_plugin=plugin)
    model = acc.prepare(Tower(64, blocks))
    x = torch.randn(16, 64)
    start = time.perf_counter()
    model(x).sum().backward()
    cold = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(5):
        model(x).sum().backward()
    warm = (time.perf_counter() - start) / 5
    return {"cold": cold, "warm": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument(
        "--child", choices=["whole", "regional"], default=None, help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "regional", args.blocks, args.backend)))
        return
    results = {}
    for kind in ("whole", "regional"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS="1")
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    kind,
                    "--blocks",
                    str(args.blocks),
                    "--backend",
                    args.backend,
                ],
                capture_output=True,
                text=True,
                check=True,
                env=env,
                timeout=900,
            )
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    whole, regional = results["whole"], results["regional"]
    print(f"model: {args.blocks} repeated blocks, backend={args.backend}")
    print(
        f"  whole-model compile: cold first step {whole['cold']:.2f} s, warm step {whole['warm'] * 1e3:.2f} ms"
    )
    print(
        f"  regional compile:    cold first step {regional['cold']:.2f} s, warm step {regional['warm'] * 1e3:.2f} ms"
    )
    print(f"  cold-start speed-up (whole / regional): {whole['cold'] / regional['cold']:.2f}x")


if __name__ == "__main__":
    main()

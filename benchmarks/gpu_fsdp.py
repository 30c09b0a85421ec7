"""Issue 11's GPU check: bf16 FSDP2 on one GPU with CPU offload and activation checkpointing,
and the peak host memory of ``prepare`` with ``cpu_ram_efficient_loading``.

``hasten launch --num_processes 1 --use_fsdp benchmarks/gpu_fsdp.py [--case train|loading]
[--width W] [--layers L] [--steps N] [--json PATH]`` (``hasten launch`` starts one FSDP process
as a one-process group). ``train``: hasten ``mixed_precision="bf16"`` with
``FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=True, activation_checkpointing=True)``;
prints where the sharded parameters live (offloaded: cpu, pinned), the GPU peak memory against
the bf16 weights' size, the median step time and the losses (they must fall). ``loading``: peak
RSS of ``prepare`` with ``cpu_ram_efficient_loading=True`` against the model's size (rank 0 holds
one full copy at most). Without CUDA it runs a tiny model on the CPU, as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from typing import Any

import torch
from _models import Tower


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _plugin(**fields: Any) -> Any:
    from hasten import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", **fields
    )


def train(args: argparse.Namespace) -> dict[str, Any]:
    from hasten import Accelerator

    plugin = _plugin(cpu_offload=True, activation_checkpointing=True)
    accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = Tower(args.width, args.layers)
    numel = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    local = next(iter(model.parameters())).to_local()
    device = accelerator.device
    x = torch.randn(args.batch, args.seq, args.width, device=device)
    y = torch.randn(args.batch, args.seq, args.width, device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else 0.0
    return {
        "params_m": numel / 1e6,
        "bf16_weights_mib": numel * 2 / 2**20,
        "shard_device": str(local.device),
        "shard_pinned": bool(local.is_pinned()) if device.type == "cuda" else None,
        "policy": repr(plugin.mixed_precision_policy),
        "gpu_peak_mib": peak,
        "step_s_median": statistics.median(times[1:] or times),
        "losses": losses,
        "falls": losses[-1] < losses[0],
        "norm": float(norm),
    }


def loading(args: argparse.Namespace) -> dict[str, Any]:
    from hasten import Accelerator, init_empty_weights

    accelerator = Accelerator(fsdp_plugin=_plugin(cpu_ram_efficient_loading=True))
    before = _rss_mib()
    torch.manual_seed(0)
    if accelerator.is_main_process:
        model = Tower(args.width, args.layers)
    else:
        with init_empty_weights():
            model = Tower(args.width, args.layers)
    model_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    built = _rss_mib()
    model = accelerator.prepare(model)
    return {
        "model_mib": model_mib,
        "rss_before_mib": before,
        "rss_built_mib": built,
        "rss_after_prepare_mib": _rss_mib(),
        "prepare_extra_mib": _rss_mib() - built,  # at most about one shard beyond the model
        "on_meta": any(p.is_meta for p in model.parameters()),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("train", "loading"), default="train")
    cuda = torch.cuda.is_available()
    parser.add_argument("--width", type=int, default=2048 if cuda else 32)
    parser.add_argument("--layers", type=int, default=16 if cuda else 2)
    parser.add_argument("--seq", type=int, default=1024 if cuda else 8)
    parser.add_argument("--batch", type=int, default=8 if cuda else 2)
    parser.add_argument("--steps", type=int, default=8 if cuda else 3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"case": args.case, "cuda": cuda, **(train if args.case == "train" else loading)(args)}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    ok = result.get("falls", True) and not result.get("on_meta", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
